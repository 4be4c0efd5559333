client {
  enabled = false
}