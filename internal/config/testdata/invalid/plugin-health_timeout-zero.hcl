plugin "ebs" {
  type = "node"
  health_timeout = "0s"
}