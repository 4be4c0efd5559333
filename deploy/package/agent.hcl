# csisupd node agent, as the package installs it. It starts as it is: a
# client that supervises the CSI plugins whose sockets appear in
# /var/lib/csisupd/plugins (<id>/csi.sock or <id>.sock), on 127.0.0.1 only,
# alone. To join a cluster name the servers below, or turn Consul on; for
# TLS and ACLs see the example configuration in the documentation.
# Files in /etc/csisupd.d load in name order; secrets go in csisupd.env.
# Start it with: systemctl enable --now csisupd

data_dir = "/var/lib/csisupd"

client {
  enabled = true
  # The package creates it mode 0750, owned by root: the agent refuses a
  # plugin directory that users it does not trust can write to.
  plugin_dir = "/var/lib/csisupd/plugins"
  # servers = ["10.0.0.11:4780", "10.0.0.12:4780", "10.0.0.13:4780"]
}

consul {
  # Turn on to register the plugins as services in the local Consul agent
  # and to find the servers in its catalog.
  enabled = false
}
