server {
  enabled = true
  bootstrap_expect = 3
}
consul {
  server_auto_join = false
}