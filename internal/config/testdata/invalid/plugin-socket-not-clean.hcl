plugin "ebs" {
  socket = "/run/ebs/../ebs/csi.sock"
}