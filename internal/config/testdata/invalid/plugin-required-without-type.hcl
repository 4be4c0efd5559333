plugin "ebs" {
  required = true
}