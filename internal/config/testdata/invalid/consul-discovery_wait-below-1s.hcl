consul {
  discovery_wait = "500ms"
}