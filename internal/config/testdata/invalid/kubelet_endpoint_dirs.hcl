client {
  kubelet_endpoint_dirs = ["/run/csi", "plugins", "/var/lib/kubelet/../kubelet"]
}