docker {
  default_plugin = "-ebs"
}