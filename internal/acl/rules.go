package acl

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Peers is a set of caller roles, proven by TLS certificates.
type Peers uint8

// The caller roles.
const (
	// PeerServer is a server (a server certificate).
	PeerServer Peers = 1 << iota
	// PeerClient is a client agent (a client certificate).
	PeerClient
	// PeerCLI is an operator's CLI or control plane (a CLI certificate).
	PeerCLI
)

// PeersAny is every role.
const PeersAny = PeerServer | PeerClient | PeerCLI

// Has reports whether p includes every role of q.
func (p Peers) Has(q Peers) bool { return q != 0 && p&q == q }

// String names the roles of p joined by "|", "server|cli" for example;
// "none" for the empty set.
func (p Peers) String() string {
	var names []string
	for _, r := range []struct {
		p    Peers
		name string
	}{{PeerServer, "server"}, {PeerClient, "client"}, {PeerCLI, "cli"}} {
		if p&r.p != 0 {
			names = append(names, r.name)
		}
	}
	if rest := p &^ PeersAny; rest != 0 {
		names = append(names, fmt.Sprintf("Peers(%#x)", uint8(rest)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, "|")
}

// TokenNeed says what token a method needs.
type TokenNeed uint8

// What a method needs of the caller's token.
const (
	// TokenCapability needs a token (or, without one, the anonymous
	// policy) that allows the rule's Capability.
	TokenCapability TokenNeed = iota
	// TokenNone needs no token (health, Bootstrap, server-only cluster
	// calls).
	TokenNone
	// TokenAny needs any valid token (ACL/TokenSelf).
	TokenAny
	// TokenManagement needs a management token (ACL administration).
	TokenManagement
)

// String names the need.
func (n TokenNeed) String() string {
	switch n {
	case TokenCapability:
		return "capability"
	case TokenNone:
		return "none"
	case TokenAny:
		return "any"
	case TokenManagement:
		return "management"
	}
	return fmt.Sprintf("TokenNeed(%d)", uint8(n))
}

// Rule is what one gRPC method requires.
type Rule struct {
	// Peers are the roles that may call the method at all (checked when
	// TLS is on).
	Peers Peers
	// Capability is what a token must allow; zero with Token ==
	// TokenCapability is invalid.
	Capability Capability
	// Token is what the caller's token must be.
	Token TokenNeed
	// ServerIdentity lets a caller proven to be a server (a server
	// certificate) pass without a token: servers forwarding to the leader,
	// servers calling agents. Servers never use a user's token.
	ServerIdentity bool
	// Node marks the Cluster methods agents call for their own node. With
	// tls.verify_node_name a client certificate calling one must name its
	// node (tls cert create --client --node); the server's Cluster service
	// checks the name against the node the call is for (CallerNode).
	Node bool
}

// Validate reports what is inconsistent in r: no peers, an unknown token
// need, a capability that is not read or write on a known resource where
// one is needed, or one where none is used.
func (r Rule) Validate() error {
	var errs []error
	if r.Peers == 0 || r.Peers&^PeersAny != 0 {
		errs = append(errs, fmt.Errorf("peers %s: want a non-empty set of server, client and cli", r.Peers))
	}
	switch r.Token {
	case TokenCapability:
		if !r.Capability.valid() {
			errs = append(errs, fmt.Errorf("token need capability with capability %q: want read or write on one of %s", r.Capability, resourceList()))
		}
	case TokenNone, TokenAny, TokenManagement:
		if !r.Capability.IsZero() {
			errs = append(errs, fmt.Errorf("token need %s with capability %s, which it does not use", r.Token, r.Capability))
		}
	default:
		errs = append(errs, fmt.Errorf("unknown token need %s", r.Token))
	}
	return errors.Join(errs...)
}

// Full method names of the gRPC services csisupd serves that are not in
// its API: health checks and server reflection.
const (
	// HealthCheckMethod is grpc.health.v1.Health/Check.
	HealthCheckMethod = "/grpc.health.v1.Health/Check"
	// HealthWatchMethod is grpc.health.v1.Health/Watch.
	HealthWatchMethod = "/grpc.health.v1.Health/Watch"
	// HealthListMethod is grpc.health.v1.Health/List.
	HealthListMethod = "/grpc.health.v1.Health/List"
	// ReflectionInfoMethod is server reflection, version 1.
	ReflectionInfoMethod = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	// ReflectionInfoAlphaMethod is server reflection, version 1alpha.
	ReflectionInfoAlphaMethod = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// RuleFor returns the rule of a gRPC method, named as gRPC names it
// ("/csisupd.v1.Control/DeleteVolume"); false when the method has none and
// must be refused.
func RuleFor(fullMethod string) (Rule, bool) {
	r, ok := methodRules[fullMethod]
	return r, ok
}

// RaisedRuleFor returns the rule a call of fullMethod with req must pass
// besides the method's own: a forced call that can leave a volume held on
// a node that is up, which a token that may only use volumes must not
// make. A release with force 2 skips every step that fails, and a forced
// deregistration forgets claims; both need operator:write too (a server
// forwarding such a call passes by its identity, as it did the
// forwarding follower's check). False when the call needs nothing more.
func RaisedRuleFor(fullMethod string, req any) (Rule, bool) {
	switch r := req.(type) {
	case *csisupdv1.VolumeReleaseRequest:
		if fullMethod == csisupdv1.Control_ReleaseVolume_FullMethodName && r.GetForce() >= 2 {
			return forcedRule, true
		}
	case *csisupdv1.VolumeDeleteRequest:
		if fullMethod == csisupdv1.Control_DeleteVolume_FullMethodName && r.GetForce() {
			return forcedRule, true
		}
	}
	return Rule{}, false
}

// forcedRule is the raised rule of RaisedRuleFor.
var forcedRule = controlRule(ResourceOperator, LevelWrite)

// Rules returns a copy of the whole table, keyed by full method name.
func Rules() map[string]Rule { return maps.Clone(methodRules) }

// noToken is the rule of a method that needs no token.
func noToken(p Peers) Rule { return Rule{Peers: p, Token: TokenNone} }

// needs is the rule of a method that needs capability r:l of a token, or
// a server's identity.
func needs(p Peers, r Resource, l Level) Rule {
	return Rule{Peers: p, Capability: Capability{Resource: r, Level: l}, ServerIdentity: true}
}

// agentRule is the rule of an Agent method: every role may call it.
func agentRule(r Resource, l Level) Rule { return needs(PeersAny, r, l) }

// csiRule is the rule of a ClientCSI method: servers and CLIs, never
// another node.
func csiRule(l Level) Rule { return needs(PeerServer|PeerCLI, ResourceVolume, l) }

// nodeRule is the rule of the Cluster methods agents call for their own
// node.
func nodeRule() Rule {
	r := needs(PeerServer|PeerClient, ResourceNode, LevelWrite)
	r.Node = true
	return r
}

// controlRule is the rule of a Control method.
func controlRule(r Resource, l Level) Rule { return needs(PeerServer|PeerCLI, r, l) }

// localClaimRule is the rule of a Control method an agent also calls for
// the workloads of its own node (the Docker volume plugin, the Agent API's
// ClaimVolume), with its client certificate and its own token: a token
// still needs the capability. Node marks those that name a node (claim,
// release, sync): the servers hold a caller bound to a node to that node,
// and with tls.verify_node_name a client certificate must name its node.
func localClaimRule(l Level, node bool) Rule {
	r := needs(PeerServer|PeerClient|PeerCLI, ResourceVolume, l)
	r.Node = node
	return r
}

// managementRule is the rule of a method only a management token may
// call.
func managementRule() Rule { return aclRule(TokenManagement) }

// aclRule is the rule of an ACL method.
func aclRule(t TokenNeed) Rule {
	return Rule{Peers: PeerServer | PeerCLI, Token: t, ServerIdentity: true}
}

// methodRules is the table RuleFor reads. It is never modified.
var methodRules = map[string]Rule{
	HealthCheckMethod: noToken(PeersAny),
	HealthWatchMethod: noToken(PeersAny),
	HealthListMethod:  noToken(PeersAny),

	csisupdv1.Agent_Status_FullMethodName:      agentRule(ResourceAgent, LevelRead),
	csisupdv1.Agent_ListPlugins_FullMethodName: agentRule(ResourcePlugin, LevelRead),
	csisupdv1.Agent_GetPlugin_FullMethodName:   agentRule(ResourcePlugin, LevelRead),
	csisupdv1.Agent_WatchEvents_FullMethodName: agentRule(ResourcePlugin, LevelRead),
	// The agent's logs, metrics and configuration (secrets redacted) are
	// its own state: agent:read, as Status.
	csisupdv1.Agent_Monitor_FullMethodName: agentRule(ResourceAgent, LevelRead),
	csisupdv1.Agent_Metrics_FullMethodName: agentRule(ResourceAgent, LevelRead),
	csisupdv1.Agent_Config_FullMethodName:  agentRule(ResourceAgent, LevelRead),
	// A profile costs the agent CPU and shows its memory: agent:write.
	// With ACLs off the Agent service itself refuses it unless
	// enable_debug is set.
	csisupdv1.Agent_Profile_FullMethodName: agentRule(ResourceAgent, LevelWrite),
	// Holding a lease keeps a claim of the node alive on the servers:
	// agent:write, the capability of whatever runs the node's workloads
	// (the Docker integration).
	csisupdv1.Agent_HoldLease_FullMethodName: agentRule(ResourceAgent, LevelWrite),
	csisupdv1.Agent_DropLease_FullMethodName: agentRule(ResourceAgent, LevelWrite),
	// A claim the agent takes for a local workload (and its release) is a
	// claim of the volume, as Control.ClaimVolume's: volume:write. The
	// agent makes it with its own token.
	csisupdv1.Agent_ClaimVolume_FullMethodName:   agentRule(ResourceVolume, LevelWrite),
	csisupdv1.Agent_ReleaseVolume_FullMethodName: agentRule(ResourceVolume, LevelWrite),

	csisupdv1.ClientCSI_ControllerGetCapabilities_FullMethodName:  csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerValidateVolume_FullMethodName:   csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerListVolumes_FullMethodName:      csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerGetVolume_FullMethodName:        csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerGetCapacity_FullMethodName:      csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerListSnapshots_FullMethodName:    csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerGetSnapshot_FullMethodName:      csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerGetVolumeHealth_FullMethodName:  csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerListVolumeHealth_FullMethodName: csiRule(LevelRead),
	csisupdv1.ClientCSI_ControllerAttachVolume_FullMethodName:     csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerDetachVolume_FullMethodName:     csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerCreateVolume_FullMethodName:     csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerDeleteVolume_FullMethodName:     csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerExpandVolume_FullMethodName:     csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerCreateSnapshot_FullMethodName:   csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerDeleteSnapshot_FullMethodName:   csiRule(LevelWrite),
	csisupdv1.ClientCSI_ControllerModifyVolume_FullMethodName:     csiRule(LevelWrite),

	csisupdv1.Cluster_PeerInfo_FullMethodName:          noToken(PeerServer),
	csisupdv1.Cluster_Join_FullMethodName:              noToken(PeerServer),
	csisupdv1.Cluster_ServerStats_FullMethodName:       noToken(PeerServer),
	csisupdv1.Cluster_NodeRegister_FullMethodName:      nodeRule(),
	csisupdv1.Cluster_NodeUpdatePlugins_FullMethodName: nodeRule(),
	csisupdv1.Cluster_NodeHeartbeat_FullMethodName:     nodeRule(),
	csisupdv1.Cluster_ResolveToken_FullMethodName:      nodeRule(),
	csisupdv1.Cluster_NodeClaims_FullMethodName:        nodeRule(),
	csisupdv1.Cluster_NodeRenewClaims_FullMethodName:   nodeRule(),
	csisupdv1.Cluster_NodeVolumeHealth_FullMethodName:  nodeRule(),

	// The scheduler agent next to csisupd calls NodeVolumes with a CLI
	// certificate; servers call it for claims.
	csisupdv1.NodeVolumes_MountVolume_FullMethodName:   csiRule(LevelWrite),
	csisupdv1.NodeVolumes_UnmountVolume_FullMethodName: csiRule(LevelWrite),
	csisupdv1.NodeVolumes_ExpandVolume_FullMethodName:  csiRule(LevelWrite),
	csisupdv1.NodeVolumes_VolumeStats_FullMethodName:   csiRule(LevelRead),
	csisupdv1.NodeVolumes_VolumeHealth_FullMethodName:  csiRule(LevelRead),
	csisupdv1.NodeVolumes_StorageHealth_FullMethodName: csiRule(LevelRead),
	csisupdv1.NodeVolumes_ListMounts_FullMethodName:    csiRule(LevelRead),

	csisupdv1.Control_ListPlugins_FullMethodName: controlRule(ResourcePlugin, LevelRead),
	csisupdv1.Control_GetPlugin_FullMethodName:   controlRule(ResourcePlugin, LevelRead),
	csisupdv1.Control_ListNodes_FullMethodName:   controlRule(ResourceNode, LevelRead),
	csisupdv1.Control_GetNode_FullMethodName:     controlRule(ResourceNode, LevelRead),
	// Clearing a node's secret lets the next agent that registers act as
	// the node: an operator's act.
	csisupdv1.Control_RekeyNode_FullMethodName:      controlRule(ResourceOperator, LevelWrite),
	csisupdv1.Control_ListVolumes_FullMethodName:    localClaimRule(LevelRead, false),
	csisupdv1.Control_GetVolume_FullMethodName:      localClaimRule(LevelRead, false),
	csisupdv1.Control_CreateVolume_FullMethodName:   localClaimRule(LevelWrite, false),
	csisupdv1.Control_RegisterVolume_FullMethodName: controlRule(ResourceVolume, LevelWrite),
	csisupdv1.Control_DeleteVolume_FullMethodName:   localClaimRule(LevelWrite, false),
	csisupdv1.Control_ClaimVolume_FullMethodName:    localClaimRule(LevelWrite, true),
	csisupdv1.Control_ReleaseVolume_FullMethodName:  localClaimRule(LevelWrite, true),
	csisupdv1.Control_RenewClaims_FullMethodName:    controlRule(ResourceVolume, LevelWrite),
	csisupdv1.Control_SyncNodeClaims_FullMethodName: localClaimRule(LevelWrite, true),
	csisupdv1.Control_CheckClaim_FullMethodName:     controlRule(ResourceVolume, LevelRead),
	csisupdv1.Control_ExpandVolume_FullMethodName:   controlRule(ResourceVolume, LevelWrite),
	csisupdv1.Control_ModifyVolume_FullMethodName:   controlRule(ResourceVolume, LevelWrite),

	csisupdv1.Control_SetVolumeAvailability_FullMethodName: controlRule(ResourceVolume, LevelWrite),
	// A plugin's drain on a node is an operator's act on the node's
	// claims of every volume of the plugin.
	csisupdv1.Control_DrainPlugin_FullMethodName:           controlRule(ResourceOperator, LevelWrite),
	csisupdv1.Control_GetPluginDrain_FullMethodName:        controlRule(ResourcePlugin, LevelRead),
	csisupdv1.Control_GetPluginCapacity_FullMethodName:     controlRule(ResourcePlugin, LevelRead),
	csisupdv1.Control_ListExternalVolumes_FullMethodName:   controlRule(ResourceVolume, LevelRead),
	csisupdv1.Control_GetVolumeHealth_FullMethodName:       controlRule(ResourceVolume, LevelRead),
	csisupdv1.Control_ListExternalSnapshots_FullMethodName: controlRule(ResourceVolume, LevelRead),

	csisupdv1.Control_CreateVolumeSnapshot_FullMethodName: controlRule(ResourceVolume, LevelWrite),
	csisupdv1.Control_ListVolumeSnapshots_FullMethodName:  controlRule(ResourceVolume, LevelRead),
	csisupdv1.Control_GetVolumeSnapshot_FullMethodName:    controlRule(ResourceVolume, LevelRead),
	csisupdv1.Control_DeleteVolumeSnapshot_FullMethodName: controlRule(ResourceVolume, LevelWrite),
	csisupdv1.Control_RaftPeers_FullMethodName:            controlRule(ResourceOperator, LevelRead),
	csisupdv1.Control_RemovePeer_FullMethodName:           controlRule(ResourceOperator, LevelWrite),
	csisupdv1.Control_SnapshotSave_FullMethodName:         controlRule(ResourceOperator, LevelWrite),
	// A restore replaces the ACL state too: with operator:write alone a
	// token could restore a snapshot holding a management token of its
	// own making.
	csisupdv1.Control_SnapshotRestore_FullMethodName: managementRule(),
	csisupdv1.Control_WatchEvents_FullMethodName:     controlRule(ResourceNode, LevelRead),

	csisupdv1.ACL_Bootstrap_FullMethodName:    aclRule(TokenNone),
	csisupdv1.ACL_TokenSelf_FullMethodName:    aclRule(TokenAny),
	csisupdv1.ACL_UpsertPolicy_FullMethodName: aclRule(TokenManagement),
	csisupdv1.ACL_ListPolicies_FullMethodName: aclRule(TokenManagement),
	csisupdv1.ACL_GetPolicy_FullMethodName:    aclRule(TokenManagement),
	csisupdv1.ACL_DeletePolicy_FullMethodName: aclRule(TokenManagement),
	csisupdv1.ACL_CreateToken_FullMethodName:  aclRule(TokenManagement),
	csisupdv1.ACL_ListTokens_FullMethodName:   aclRule(TokenManagement),
	csisupdv1.ACL_GetToken_FullMethodName:     aclRule(TokenManagement),
	csisupdv1.ACL_DeleteToken_FullMethodName:  aclRule(TokenManagement),

	ReflectionInfoMethod:      {Peers: PeersAny, Token: TokenAny},
	ReflectionInfoAlphaMethod: {Peers: PeersAny, Token: TokenAny},
}
