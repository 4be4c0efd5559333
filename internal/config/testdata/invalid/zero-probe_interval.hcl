client {
  probe_interval = "0s"
}