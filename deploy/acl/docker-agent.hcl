# The policy of an agent token that serves the Docker and Podman volume
# plugin (docker { enabled = true }): with a node identity for its own
# node, it creates, claims, releases and deletes volumes, and nothing
# more. It never forces a release on a live node nor forgets a volume
# with claims (operator), and it cannot change ACLs.
#
#   csisupd acl policy apply docker-agent docker-agent.hcl
#   csisupd acl token create --name node-1 --node-identity node-1 --policy docker-agent
volume   { policy = "write" }   # Create, Remove, Mount, Unmount, and the reconcile's sync
plugin   { policy = "read" }
operator { policy = "deny" }
