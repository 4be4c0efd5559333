client {
  max_plugin_message_size = 100
}