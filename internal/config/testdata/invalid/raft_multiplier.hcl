server {
  raft_multiplier = 11
}