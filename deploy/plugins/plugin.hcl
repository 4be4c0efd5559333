# Example: a CSI node plugin run in a container beside csisupd
# (csi-node-plugin.container). Copy to /etc/csisupd.d/plugin.hcl beside
# agent.hcl; then `csisupd plugin mounts csi.example.com --config
# /etc/csisupd.d` prints the mounts the container needs, which the
# quadlet has.
plugin "csi.example.com" {
  # The socket the plugin creates and csisupd dials. It may lie outside
  # client.plugin_dir, and wins over a socket of the same id found there or
  # registered through kubelet_registration_dir.
  socket           = "/run/csi/csi.example.com/csi.sock"
  # The fingerprint must say node: another type makes the plugin unhealthy,
  # naming both.
  type             = "node"
  # Absent or unhealthy for longer than health_timeout: one plugin-missing
  # event, and the servers see the plugin expected on this node but not
  # healthy.
  required         = true
  health_timeout   = "30s"
  # The mount root (mount_dir, default <data_dir>/volumes/<id>) is mounted
  # at this path in the container; csisupd translates the paths it sends.
  plugin_mount_dir = "/csi/volumes"
}
