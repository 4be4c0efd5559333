// Package acl holds csisupd's access control model: policies, tokens,
// the capabilities a token grants and the capability each gRPC method
// needs. It is pure: it keeps no state and starts no goroutines. The
// servers keep policies and tokens in their replicated state (package
// server) and the gRPC interceptor checks each call (package rpc).
//
// # Policies
//
// A policy is a named set of rules in HCL, one block per resource:
//
//	volume   { policy = "write" }
//	plugin   { policy = "read" }
//	operator { policy = "deny" }
//
// The resources are plugin, volume, node, operator and agent; the levels
// deny, read and write. Write implies read. A resource without a block has
// no rule, which denies it. ParsePolicy checks a policy and names the
// file and line of every problem.
//
// # Tokens
//
// A token has an accessor id, which names it (in logs, in the API), and a
// secret id, which proves it and travels in the gRPC metadata key
// TokenMetadataKey. Both are random UUIDs. Only the SHA-256 of a secret
// id is ever stored (HashSecret); SecretMatches compares in constant time.
// A management token allows everything (Management); a client token gets
// the rules of its policies compiled into one ACL (Compile): per resource,
// an explicit deny in any policy wins, otherwise the highest level.
// Requests without a token get the rules of the policy named
// AnonymousPolicy, or nothing when there is no such policy.
//
// # Node identities
//
// A client token may carry a node identity (acl token create
// --node-identity NAME), as Consul's node identities do: ACL.WithNodeIdentity
// adds node:write to its rules, with no policy needed, and NodeIdentity
// names the node. Which node a caller may act as is a CallerNode: the
// bindings of its token's node identity and, with tls.verify_node_name,
// of the node its client certificate names. Bindings only narrow: Check
// allows a node only when every binding names it, and an unbound caller
// any node (the node secret, checked by the servers, still applies). The
// gRPC interceptor puts the CallerNode into each handler's context
// (WithCallerNode); a server forwarding a call passes it on in the
// metadata key CallerNodeMetadataKey (AppendCallerNode,
// CallerNodeFromIncoming), which is safe to read from any peer because it
// can only narrow. Rule.Node marks the methods the servers check it for.
//
// # Method rules
//
// RuleFor returns what a gRPC method requires: which caller roles (Peers,
// proven by TLS certificates) may call it at all, and what its token must
// allow. A caller proven to be a server passes without a token where the
// rule says ServerIdentity: servers forwarding to the leader and servers
// calling agents act with their own identity and never carry a user's
// token. The table, one row per method of every service a csisupd process
// serves:
//
//	grpc.health.v1.Health       Check, Watch, List                    any peer, no token
//	Agent                       Status, Monitor, Metrics, Config      agent:read
//	                            Profile                               agent:write (with ACLs off the
//	                                                                  agent serves it only with
//	                                                                  enable_debug = true)
//	                            HoldLease, DropLease                  agent:write
//	                            ClaimVolume, ReleaseVolume            volume:write (the agent then
//	                                                                  claims with its own token)
//	                            ListPlugins, GetPlugin, WatchEvents   plugin:read
//	                            (any peer; server identity passes)
//	ClientCSI                   ControllerGetCapabilities, ControllerValidateVolume,
//	                            ControllerListVolumes, ControllerGetVolume,
//	                            ControllerGetCapacity, ControllerListSnapshots,
//	                            ControllerGetSnapshot, ControllerGetVolumeHealth,
//	                            ControllerListVolumeHealth                         volume:read
//	                            ControllerAttachVolume, ControllerDetachVolume,
//	                            ControllerCreateVolume, ControllerDeleteVolume,
//	                            ControllerExpandVolume, ControllerModifyVolume,
//	                            ControllerCreateSnapshot, ControllerDeleteSnapshot volume:write
//	                            (servers and CLIs, never a client certificate;
//	                            server identity passes)
//	Cluster                     PeerInfo, Join, ServerStats           servers only, no token
//	                            NodeRegister, NodeUpdatePlugins,
//	                            NodeHeartbeat, ResolveToken,
//	                            NodeClaims, NodeVolumeHealth,
//	                            NodeRenewClaims                       node:write (servers and clients;
//	                                                                  server identity passes; agents
//	                                                                  present their own agent token;
//	                                                                  Node: for the caller's own node,
//	                                                                  and with tls.verify_node_name a
//	                                                                  client certificate must name it)
//	Control                     ListPlugins, GetPlugin, GetPluginDrain,
//	                            GetPluginCapacity                     plugin:read
//	                            ListNodes, GetNode, WatchEvents       node:read
//	                            ListVolumes, GetVolume, ListExternalVolumes,
//	                            ListExternalSnapshots, GetVolumeHealth,
//	                            CheckClaim                            volume:read
//	                            CreateVolume, RegisterVolume, DeleteVolume,
//	                            ClaimVolume, ReleaseVolume, RenewClaims,
//	                            SyncNodeClaims, ExpandVolume, ModifyVolume,
//	                            SetVolumeAvailability                 volume:write
//	                            RaftPeers                             operator:read
//	                            RemovePeer, SnapshotSave, DrainPlugin operator:write
//	                            SnapshotRestore                       a management token (a restore
//	                                                                  replaces the ACL state too)
//	                            (servers and CLIs; server identity passes)
//	                            ListVolumes, GetVolume, CreateVolume,
//	                            DeleteVolume, ClaimVolume, ReleaseVolume,
//	                            SyncNodeClaims                        also client certificates: an
//	                                                                  agent's local claims (the Docker
//	                                                                  volume plugin, Agent.ClaimVolume)
//	                                                                  with its own token; Node for
//	                                                                  claim, release and sync: a caller
//	                                                                  bound to a node acts for it only
//	                            ReleaseVolume with force 2, DeleteVolume
//	                            with force                            operator:write besides volume:write
//	                                                                  (RaisedRuleFor: they can leave a
//	                                                                  volume held on a live node)
//	ACL                         Bootstrap                             no token
//	                            TokenSelf                             any valid token
//	                            every other method                    a management token
//	                            (servers and CLIs; server identity passes)
//	grpc.reflection.v1 and v1alpha ServerReflection/ServerReflectionInfo  any peer, any valid token
//
// A method missing from the table has no rule: the interceptor refuses it.
package acl
