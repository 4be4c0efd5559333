plugin "ebs" {
  secrets_file = "secrets/ebs.hcl"
}