acl {
  token {
  }
}