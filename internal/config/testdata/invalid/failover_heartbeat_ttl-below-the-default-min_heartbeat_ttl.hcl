server {
  failover_heartbeat_ttl = "5s"
}