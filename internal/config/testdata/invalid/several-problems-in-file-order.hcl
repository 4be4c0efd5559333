client {
  probe_interval = "x"
}
bogus = 1
ports { rpc = true }