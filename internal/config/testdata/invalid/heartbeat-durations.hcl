server {
  heartbeat_grace = "0s"
  min_heartbeat_ttl = "-1s"
  failover_heartbeat_ttl = "0s"
  server_stabilization_time = "0s"
}