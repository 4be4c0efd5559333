consul {
  check_interval = "500ms"
}