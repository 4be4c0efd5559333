client {
  enabled = false
}
server {
  enabled = true
  bootstrap_expect = 1
}
docker {
  enabled = true
}