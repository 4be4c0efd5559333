plugin "ebs" {
  socket = "csi.sock"
}