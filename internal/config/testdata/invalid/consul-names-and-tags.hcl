consul {
  service_name = " "
  plugin_service_name = "csi-{{ID}}"
  tags = ["a", ""]
  server_service_name = ""
  check_interval = "0s"
}