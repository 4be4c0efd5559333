ports {
  rpc = "abc"
}