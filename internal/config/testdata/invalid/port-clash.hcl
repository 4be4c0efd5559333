ports {
  rpc = 5000
  raft = 5000
}