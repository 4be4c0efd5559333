server {
  min_heartbeat_ttl = "1m"
  failover_heartbeat_ttl = "30s"
}