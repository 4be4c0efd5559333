client {
  max_destructive_in_flight = 0
}