server {
  max_heartbeats_per_second = -2.5
}