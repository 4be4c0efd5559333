consul {
  discovery_wait = "11m"
}