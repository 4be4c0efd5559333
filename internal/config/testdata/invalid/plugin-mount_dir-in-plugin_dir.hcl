client {
  plugin_dir = "/run/csi"
}
plugin "ebs" {
  mount_dir = "/run/csi/mnt"
}