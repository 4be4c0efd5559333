client {
  plugin_dir = ""
}