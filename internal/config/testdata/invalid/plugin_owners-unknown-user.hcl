client {
  plugin_owners = ["0", "no-such-user-csisupd", ""]
}