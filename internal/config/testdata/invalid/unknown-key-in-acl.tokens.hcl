acl {
  tokens {
    agnet = "x"
  }
}