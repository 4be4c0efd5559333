server {
  enabled = true
}