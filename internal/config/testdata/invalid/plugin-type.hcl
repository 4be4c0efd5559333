plugin "ebs" {
  type = "both"
}