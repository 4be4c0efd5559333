client {
  allow_mount_flags = ["suid", "exec", "dev", ""]
}