client {
  probe_timeout = "-1s"
  fingerprint_interval = "0s"
  deregister_grace = "-5m"
  rescan_interval = "0s"
  rpc_timeout = "0s"
}
consul {
  sync_interval = "0s"
}