ports {
  http = 0
}