plugin "a" {
  mount_dri = "/x"
}