plugin "ebs" {
  mount_dir = "mnt"
}