plugin "ebs" {
  plugin_mount_dir = "csi"
}