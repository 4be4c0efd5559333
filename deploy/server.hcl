# Example of the extra configuration of one of three servers.
server {
  enabled          = true
  bootstrap_expect = 3
  # retry_join: the other servers' gRPC addresses. Leave it out to find them in Consul's
  # catalog (consul.server_auto_join); bootstrap_expect alone decides when the cluster forms.
  retry_join       = ["10.0.0.11:4780", "10.0.0.12:4780", "10.0.0.13:4780"]
  # A node down for longer than this has its volume claims released through the
  # controller alone; its agent unmounts what is left when it returns.
  claim_gc_grace   = "5m"
  # A claim left taken but unmounted while its own leader still leads is finished after
  # this long, or released when a step fails (one whose leader died or lost its term is
  # resumed by the new leader at once); a scheduler that saw an error learns the outcome
  # sooner by claiming again.
  claim_resume_timeout = "2m"
}

# A server presents a server certificate (`csisupd tls cert create --server`, one per server);
# the other tls and acl keys come from agent.hcl.
tls {
  cert_file = "/etc/csisupd.d/tls/global-server-csisupd-0.pem"
  key_file  = "/etc/csisupd.d/tls/global-server-csisupd-0-key.pem"
}
