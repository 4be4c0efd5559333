client {
  plugin_dir = "plugins"
}