acl {
  tokens {
  }
  tokens {
  }
}