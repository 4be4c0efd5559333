package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// CapPublishReadonly is the controller capability by which read-only
// claims are published read-only.
const CapPublishReadonly = "PUBLISH_READONLY"

// MethodClaimVolume names the claim in the CapabilityMissing errors of
// admission: the Control method that takes claims.
const MethodClaimVolume = "ClaimVolume"

// Reader is the part of the replicated state admission reads;
// *state.Store is one.
type Reader interface {
	Node(id string) *statepb.ClusterNode
	// ControllerAdvertises reports whether a controller instance of the
	// plugin, healthy or not, advertises a controller capability.
	ControllerAdvertises(pluginID, capability string) bool
	Volumes(pluginID string) []*statepb.Volume
}

// Lease bounds: the lease_ttl a claim may carry.
const (
	MinLeaseTTL = 5 * time.Second
	MaxLeaseTTL = 24 * time.Hour
)

// CheckClaimRequest checks the fields of a claim request that need no
// state: the ids, the owner (an id, or empty) and the lease (unset, or
// MinLeaseTTL to MaxLeaseTTL). Its errors are InvalidArgument naming the
// field.
func CheckClaimRequest(req *csisupdv1.VolumeClaimRequest) error {
	switch {
	case req.GetId() == "" || req.GetNodeId() == "" || req.GetWorkloadId() == "":
		return status.Error(codes.InvalidArgument, "claim volume: id, node_id and workload_id are required")
	// The agent names directories after them.
	case !ids.ValidPathID(req.GetWorkloadId()):
		return status.Errorf(codes.InvalidArgument, "claim volume: workload_id %q must match %s and not be . or ..", req.GetWorkloadId(), ids.PluginIDPattern)
	case req.GetOwner() != "" && !ids.ValidPluginID(req.GetOwner()):
		return status.Errorf(codes.InvalidArgument, "claim volume: owner %q must match %s", req.GetOwner(), ids.PluginIDPattern)
	}
	if d := req.GetLeaseTtl(); d != nil {
		if err := d.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "claim volume: lease_ttl: %v", err)
		}
		if ttl := d.AsDuration(); ttl < MinLeaseTTL || ttl > MaxLeaseTTL {
			return status.Errorf(codes.InvalidArgument, "claim volume: lease_ttl %s is out of range: give %s to %s, or none for a claim without a lease",
				ttl, MinLeaseTTL, MaxLeaseTTL)
		}
	}
	return nil
}

// Admit builds the claim a request asks for and checks it with CheckTake
// against the state the leader reads. The FSM checks the claim again
// when it applies the claim_take command, against the state of that
// moment: Admit only refuses early.
func Admit(st Reader, v *statepb.Volume, req *csisupdv1.VolumeClaimRequest, now *timestamppb.Timestamp) (*statepb.VolumeClaim, error) {
	node := st.Node(req.GetNodeId())
	if node == nil {
		return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetNodeId())
	}
	usage, err := Usage(v, req)
	if err != nil {
		return nil, err
	}
	claim := &statepb.VolumeClaim{
		NodeId:         node.GetId(),
		CsiNodeId:      nodePlugin(node, v.GetPluginId()).GetNodeId(),
		ReadOnly:       usage.GetReadOnly(),
		ClaimedAt:      now,
		WorkloadId:     req.GetWorkloadId(),
		State:          StateTaken,
		Usage:          usage,
		StateUpdatedAt: now,
		Owner:          req.GetOwner(),
		LeaseTtl:       req.GetLeaseTtl(),
	}
	if err := CheckTake(st, v, claim); err != nil {
		return nil, err
	}
	return claim, nil
}

// CheckTake checks a new claim against the node, the volume and its
// claims as st holds them: the node is ready; neither the volume nor
// its plugin on the node is kept from new claims (CheckAvailability); the
// node runs the plugin's node
// service, healthy and with a CSI node id (the claim's), and with the
// VOLUME_MOUNT_GROUP node capability when the usage names a mount group
// (a CapabilityMissing error otherwise); the usage is one
// of the volume's capabilities; the node's topology reaches the volume;
// the node stays within the plugin's max_volumes; and the access modes of
// the claim and of every claim the volume has, in any state, allow it. It
// is pure: the leader calls it to refuse early and the FSM to apply
// claim_take.
func CheckTake(st Reader, v *statepb.Volume, claim *statepb.VolumeClaim) error {
	if err := checkNew(v, claim); err != nil {
		return err
	}
	if _, old := Find(v, claim.GetNodeId(), claim.GetWorkloadId()); old != nil {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("workload %q already holds a claim of volume %q on node %q (state %s, claim index %d)",
				claim.GetWorkloadId(), v.GetId(), claim.GetNodeId(), old.GetState(), old.GetClaimIndex()))
	}
	node := st.Node(claim.GetNodeId())
	if node == nil {
		return status.Errorf(codes.NotFound, "node %q not found", claim.GetNodeId())
	}
	if node.GetStatus() != state.NodeStatusReady {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleNodeNotReady,
			fmt.Sprintf("node %q is %s (%s)", node.GetId(), node.GetStatus(), node.GetStatusDescription()))
	}
	if err := CheckAvailability(v, node); err != nil {
		return err
	}
	p := nodePlugin(node, v.GetPluginId())
	if _, nodeService := plugin.Type(p.GetType()).Roles(); p == nil || !nodeService || !p.GetHealthy() || p.GetNodeId() == "" {
		why := "does not run there"
		switch {
		case p == nil:
		case !nodeService:
			why = fmt.Sprintf("runs there as a %s plugin, without the node service", p.GetType())
		case !p.GetHealthy():
			why = fmt.Sprintf("is unhealthy there (%s)", p.GetHealthDescription())
		default:
			why = "reports no CSI node id there"
		}
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRulePlugin,
			fmt.Sprintf("plugin %q of volume %q %s: node %q", v.GetPluginId(), v.GetId(), why, node.GetId()))
	}
	if claim.GetCsiNodeId() != p.GetNodeId() {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("plugin %q reports CSI node id %q on node %q, not %q", v.GetPluginId(), p.GetNodeId(), node.GetId(), claim.GetCsiNodeId()))
	}
	// A mount group the plugin does not know would be dropped silently
	// by it, and the workload would find files it cannot read: refuse
	// the claim before anything is published.
	if claim.GetUsage().GetVolumeMountGroup() != "" && !slices.Contains(p.GetNodeCapabilities(), plugin.CapVolumeMountGroup) {
		return csisupdv1.NewNodeCapabilityMissingError(v.GetPluginId(), node.GetId(), MethodClaimVolume, plugin.CapVolumeMountGroup)
	}
	usage := claim.GetUsage()
	if !slices.ContainsFunc(DefaultCapabilities(v.GetCapabilities()), func(c *statepb.VolumeCapability) bool {
		typ, mode := c.GetAccessType(), c.GetAccessMode()
		if typ == "" {
			typ = "mount"
		}
		if mode == "" {
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()
		}
		return typ == usage.GetAccessType() && mode == usage.GetAccessMode()
	}) {
		var have []string
		for _, c := range DefaultCapabilities(v.GetCapabilities()) {
			have = append(have, c.GetAccessType()+" "+c.GetAccessMode())
		}
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleCapability,
			fmt.Sprintf("volume %q has no capability %s %s (it has: %s)", v.GetId(), usage.GetAccessType(), usage.GetAccessMode(), strings.Join(have, ", ")))
	}
	if !TopologyFits(v.GetAccessibleTopology(), p.GetAccessibleTopology()) {
		var segs []string
		for _, seg := range v.GetAccessibleTopology() {
			segs = append(segs, fmt.Sprint(seg.GetSegments()))
		}
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleTopology,
			fmt.Sprintf("volume %q is reachable from %s; node %q has topology %v", v.GetId(), strings.Join(segs, " or "), node.GetId(), p.GetAccessibleTopology()))
	}
	if limit := p.GetMaxVolumes(); limit > 0 {
		used := map[string]bool{}
		for _, other := range st.Volumes(v.GetPluginId()) {
			if other.GetId() == v.GetId() {
				continue
			}
			if slices.ContainsFunc(other.GetClaims(), func(c *statepb.VolumeClaim) bool { return c.GetNodeId() == node.GetId() }) {
				used[other.GetId()] = true
			}
		}
		if len(used) >= int(limit) {
			return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleMaxVolumes,
				fmt.Sprintf("node %q already has %d volumes of plugin %q claimed, its max_volumes", node.GetId(), len(used), v.GetPluginId()))
		}
	}
	if mode, r := ruleOf(claim); r.readersOnly && !claim.GetReadOnly() {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode,
			fmt.Sprintf("access mode %s allows read-only claims only; the claim of workload %q is read-write", mode, claim.GetWorkloadId()))
	}
	for _, old := range v.GetClaims() {
		if why := accessConflict(claim, old); why != "" {
			return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode, why)
		}
	}
	// Claims on one node share one controller publication: a read-write
	// claim cannot use a read-only one.
	if !claim.GetReadOnly() && st.ControllerAdvertises(v.GetPluginId(), CapPublishReadonly) {
		for _, old := range v.GetClaims() {
			if old.GetNodeId() == claim.GetNodeId() && old.GetControllerPublished() && old.GetReadOnly() &&
				!slices.ContainsFunc(v.GetClaims(), func(c *statepb.VolumeClaim) bool {
					return c.GetNodeId() == claim.GetNodeId() && c.GetControllerPublished() && !c.GetReadOnly()
				}) {
				return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode,
					fmt.Sprintf("volume %q is published read-only to node %q for workload %q; a read-write claim there needs the read-only claims released first",
						v.GetId(), claim.GetNodeId(), old.GetWorkloadId()))
			}
		}
	}
	return nil
}

// NodeClaims returns the claims of volumes that a node holds, except
// those released without it, sorted by volume and workload, as of the
// state's index, each with what the servers hold of it (plugin, CSI
// volume id, usage, the node's paths), so that an agent that lost its
// record of a mount can still undo it.
func NodeClaims(index uint64, volumes []*statepb.Volume, nodeID string) *csisupdv1.NodeClaimsResponse {
	out := &csisupdv1.NodeClaimsResponse{Index: index}
	for _, v := range volumes {
		for _, c := range v.GetClaims() {
			if c.GetNodeId() == nodeID && !c.GetNodeGone() {
				out.Claims = append(out.Claims, &csisupdv1.NodeClaimRef{
					VolumeId: v.GetId(), WorkloadId: c.GetWorkloadId(), ClaimIndex: c.GetClaimIndex(),
					PluginId: v.GetPluginId(), ExternalId: v.GetExternalId(), Usage: statepb.VolumeUsageToAPI(c.GetUsage()),
					HostPath: c.GetHostPath(), StagingPath: c.GetStagingPath(), Mounted: c.GetMounted(), State: c.GetState(),
				})
			}
		}
	}
	slices.SortFunc(out.Claims, func(a, b *csisupdv1.NodeClaimRef) int {
		return cmp.Or(strings.Compare(a.GetVolumeId(), b.GetVolumeId()), strings.Compare(a.GetWorkloadId(), b.GetWorkloadId()))
	})
	return out
}
