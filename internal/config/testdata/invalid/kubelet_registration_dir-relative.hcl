client {
  kubelet_registration_dir = "plugins_registry"
}