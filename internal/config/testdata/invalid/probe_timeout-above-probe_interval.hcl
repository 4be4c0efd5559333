client {
  probe_interval = "2s"
  probe_timeout = "3s"
}