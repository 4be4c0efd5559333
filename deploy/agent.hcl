# Example configuration of a csisupd node agent. Copy to /etc/csisupd.d/agent.hcl.
# Every key is optional; the values shown are the defaults unless marked.

name      = "node-1"              # default: the host name
data_dir  = "/var/lib/csisupd"
# Default 127.0.0.1. Listen on all addresses only where others must reach this node: servers
# call ClientCSI on agents, agents and operators call the servers. TLS and ACLs below keep
# everyone else out.
bind_addr = "0.0.0.0"
log_level = "info"                # trace, debug, info, warn, error
log_json  = false
# Serve Go's profiles under /debug/pprof/ on ports.http, without authentication, and
# (ACLs off) to `csisupd operator debug`. With ACLs on, operator debug profiles with a
# token that has agent = "write" whatever this says. A reload turns it on or off.
enable_debug = false

ports {
  rpc  = 4780                     # all gRPC APIs (Agent, ClientCSI, Control, health, reflection)
  http = 4782                     # /v1/health and /metrics
  raft = 4781                     # servers only
}

client {
  enabled              = true
  plugin_dir           = "/var/lib/csisupd/plugins"  # <plugin_dir>/<id>/csi.sock or <plugin_dir>/<id>.sock
  # Sockets there are trusted with volume secrets: the agent refuses a plugin_dir that users other
  # than root and its own can write to, and dials only sockets owned by root, its own user or
  # plugin_owners (user names or uids). Symlinks there are never followed.
  allow_insecure_plugin_dir = false
  plugin_owners        = []
  # Mount flags suid and dev reach a plugin only when listed here: suid lets a set-user-id file on a
  # volume gain root on this host, dev lets a device node on it open a host device. The servers let
  # both through to the node, which refuses them unless allowed.
  allow_mount_flags    = []
  probe_interval       = "5s"
  probe_timeout        = "3s"
  fingerprint_interval = "5m"
  deregister_grace     = "10s"
  rescan_interval      = "30s"
  rpc_timeout          = "2m"     # ClientCSI calls that carry no deadline
  max_destructive_in_flight = 1
  # servers: the servers' gRPC addresses. Leave it out to find them in Consul's catalog
  # (consul.client_auto_join), for example:
  # servers            = ["10.0.0.11:4780", "10.0.0.12:4780", "10.0.0.13:4780"]
}

consul {
  enabled              = true
  # address and token default to CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN(_FILE).
  service_name         = "csisupd"
  plugin_service_name  = "csi-plugin-{{id}}"
  tags                 = []
  enable_tag_override  = false
  deregister_on_shutdown = true    # a stop with Consul unreachable still exits 0, with a warning
  sync_interval        = "30s"
  check_interval       = "10s"     # Consul's gRPC check of the agent; plugin services alias it
  # check_tls_server_name = "..."  # with tls: default the first DNS name of tls.cert_file
  server_service_name  = "csisupd-server"
  server_auto_join     = true      # servers with no retry_join find each other in Consul
  client_auto_join     = true      # agents with no client.servers find the servers in Consul
  discovery_wait       = "5m"      # blocking query of the servers: one request per wait while nothing changes
}

# TLS on every port (gRPC and raft). Make the files with `csisupd tls ca create` and
# `csisupd tls cert create --client` (servers: --server, see server.hcl; operators: --cli).
# The certificate's role name (client.<region>.csisupd) is what servers check.
tls {
  ca_file                = "/etc/csisupd.d/tls/csisupd-agent-ca.pem"
  cert_file              = "/etc/csisupd.d/tls/global-client-csisupd-0.pem"
  key_file               = "/etc/csisupd.d/tls/global-client-csisupd-0-key.pem"
  verify_incoming        = true   # callers need a certificate from the CA (the CLI: a --cli one)
  verify_outgoing        = true
  verify_server_hostname = true   # a server must prove the server role
  # With one certificate per node (`csisupd tls cert create --client --node NAME`):
  # servers refuse node calls whose certificate names another node.
  # verify_node_name     = true
}
# region = "global"               # part of the role names in the certificates

# ACLs: every API call needs a token that allows it. Bootstrap once with `csisupd acl bootstrap`.
acl {
  enabled = true
  # The agent's own token (`csisupd acl token create --node-identity NAME`, NAME this
  # node's name; or a policy with node = write), here or, better, as
  # CSISUPD_AGENT_TOKEN in /etc/csisupd.d/csisupd.env (mode 0600):
  # tokens { agent = "..." }
}

# Where the agent stages and publishes a plugin's volumes (default
# <data_dir>/volumes/<plugin id>). A plugin in a container that sees the
# directory at another path says so with plugin_mount_dir.
# plugin "ebs.csi.aws.com" {
#   mount_dir        = "/var/lib/csisupd/volumes/ebs"
#   plugin_mount_dir = "/csi/volumes"
# }
