acl {
  enabled = true
}