server {
  max_heartbeats_per_second = 0
}