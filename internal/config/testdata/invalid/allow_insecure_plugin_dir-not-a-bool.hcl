client {
  allow_insecure_plugin_dir = "maybe"
}