package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Expansion states, as VolumeExpansion.state names them.
const (
	// ExpansionController: ControllerExpandVolume has not answered yet.
	ExpansionController = "controller"
	// ExpansionNodes: the controller step is done, or the plugin has
	// none; the nodes in nodes_pending still need NodeExpandVolume.
	ExpansionNodes = "nodes"
)

// Snapshot states, as VolumeSnapshot.state names them.
const (
	// SnapshotCreating: recorded before CreateSnapshot answered.
	SnapshotCreating = "creating"
	// SnapshotCreated: the plugin has the snapshot.
	SnapshotCreated = "created"
	// SnapshotDeleting: DeleteSnapshot is under way.
	SnapshotDeleting = "deleting"
)

// Plugin capabilities that say how a plugin expands volumes, as
// fingerprints record them.
const (
	CapExpansionOnline  = "VOLUME_EXPANSION_ONLINE"
	CapExpansionOffline = "VOLUME_EXPANSION_OFFLINE"
)

// CheckExpandRequest checks a request to grow v to required bytes, with
// limit (0: the volume's capacity_limit_bytes) as the most it may get. It
// returns the limit to pass on, and done when v already has the size
// (nothing to do). A shrink, a required size over the limit, or a
// different expansion already under way is refused.
func CheckExpandRequest(v *statepb.Volume, required, limit int64) (effectiveLimit int64, done bool, err error) {
	if required <= 0 {
		return 0, false, status.Errorf(codes.InvalidArgument, "expand volume %q: capacity must be positive", v.GetId())
	}
	if limit < 0 {
		return 0, false, status.Errorf(codes.InvalidArgument, "expand volume %q: capacity_max_bytes %d is negative", v.GetId(), limit)
	}
	if vl := v.GetCapacityLimitBytes(); vl > 0 && (limit == 0 || limit > vl) {
		limit = vl
	}
	if limit > 0 && required > limit {
		return 0, false, status.Errorf(codes.InvalidArgument, "expand volume %q: %d bytes is over the volume's limit of %d bytes", v.GetId(), required, limit)
	}
	if e := v.GetExpansion(); e != nil {
		if e.GetCapacityBytes() != required {
			return 0, false, status.Errorf(codes.FailedPrecondition, "expand volume %q: an expansion to %d bytes is under way (state %s)", v.GetId(), e.GetCapacityBytes(), e.GetState())
		}
		return limit, false, nil
	}
	if required < v.GetCapacityBytes() {
		return 0, false, status.Errorf(codes.InvalidArgument, "expand volume %q: %d bytes is less than its capacity of %d bytes; volumes cannot shrink", v.GetId(), required, v.GetCapacityBytes())
	}
	return limit, required == v.GetCapacityBytes(), nil
}

// CheckOfflineExpansion refuses to expand v while it is claimed when the
// plugin (its capabilities pluginCaps) can expand volumes only offline.
func CheckOfflineExpansion(v *statepb.Volume, pluginCaps []string) error {
	if !slices.Contains(pluginCaps, CapExpansionOffline) || slices.Contains(pluginCaps, CapExpansionOnline) || len(v.GetClaims()) == 0 {
		return nil
	}
	var names []string
	for _, c := range v.GetClaims() {
		names = append(names, RefOf(v.GetId(), c).String())
	}
	return status.Errorf(codes.FailedPrecondition, "expand volume %q: plugin %q expands volumes only offline, and the volume is claimed: %s; release the claims first",
		v.GetId(), v.GetPluginId(), strings.Join(names, ", "))
}

// ExpansionNodesOf returns the nodes where v is mounted, the nodes whose
// mounts need NodeExpandVolume, sorted.
func ExpansionNodesOf(v *statepb.Volume) []string {
	var nodes []string
	for _, c := range v.GetClaims() {
		if c.GetMounted() && c.GetState() == StateTaken && !slices.Contains(nodes, c.GetNodeId()) {
			nodes = append(nodes, c.GetNodeId())
		}
	}
	slices.Sort(nodes)
	return nodes
}

// NewExpansion returns the command that starts an expansion of v to
// required bytes in state (ExpansionController, or ExpansionNodes when
// the plugin has no controller step).
func NewExpansion(v *statepb.Volume, required, limit int64, state string, now *timestamppb.Timestamp) *statepb.VolumeExpandCommand {
	e := &statepb.VolumeExpansion{CapacityBytes: required, LimitBytes: limit, State: state, StartedAt: now}
	if state == ExpansionNodes {
		e.NodesPending = ExpansionNodesOf(v)
	}
	return &statepb.VolumeExpandCommand{VolumeId: v.GetId(), VolumeIndex: v.GetModifyIndex(), Expansion: e}
}

// ExpansionStep returns the command that records the next state of v's
// expansion: e, its new state (nil when it is done), and capacity, the
// size the plugin reported (0 when unknown).
func ExpansionStep(v *statepb.Volume, e *statepb.VolumeExpansion, capacity int64) *statepb.VolumeExpandCommand {
	return &statepb.VolumeExpandCommand{VolumeId: v.GetId(), VolumeIndex: v.GetModifyIndex(), Expansion: e, CapacityBytes: capacity}
}

// CheckExpandStep checks a volume_expand command against v, the volume
// as stored: v is the row the leader decided on; a new expansion grows
// the volume within its limit and has a known state; a step of an
// expansion under way keeps its target; a recorded capacity never
// shrinks.
func CheckExpandStep(v *statepb.Volume, cmd *statepb.VolumeExpandCommand) error {
	if cmd.GetVolumeIndex() != v.GetModifyIndex() {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("volume %q changed at index %d after the expansion step was decided at index %d", v.GetId(), v.GetModifyIndex(), cmd.GetVolumeIndex()))
	}
	old, e := v.GetExpansion(), cmd.GetExpansion()
	switch {
	case old == nil && e == nil:
		return status.Errorf(codes.FailedPrecondition, "volume %q: no expansion is under way", v.GetId())
	case old == nil:
		_, done, err := CheckExpandRequest(v, e.GetCapacityBytes(), e.GetLimitBytes())
		if err != nil {
			return err
		}
		if done {
			return status.Errorf(codes.FailedPrecondition, "volume %q already has %d bytes: nothing to expand", v.GetId(), v.GetCapacityBytes())
		}
	case e != nil && (e.GetCapacityBytes() != old.GetCapacityBytes() || e.GetLimitBytes() != old.GetLimitBytes()):
		return status.Errorf(codes.FailedPrecondition, "volume %q: an expansion to %d bytes (limit %d) is under way, not to %d (limit %d)",
			v.GetId(), old.GetCapacityBytes(), old.GetLimitBytes(), e.GetCapacityBytes(), e.GetLimitBytes())
	}
	if e != nil && e.GetState() != ExpansionController && e.GetState() != ExpansionNodes {
		return status.Errorf(codes.InvalidArgument, "volume %q: unknown expansion state %q", v.GetId(), e.GetState())
	}
	if c := cmd.GetCapacityBytes(); c != 0 && c < v.GetCapacityBytes() {
		return status.Errorf(codes.InvalidArgument, "volume %q: recorded capacity cannot shrink from %d to %d bytes", v.GetId(), v.GetCapacityBytes(), c)
	}
	return nil
}

// ApplyExpandStep returns v with cmd applied; cmd was checked.
func ApplyExpandStep(v *statepb.Volume, cmd *statepb.VolumeExpandCommand) {
	v.Expansion = cmd.GetExpansion()
	if c := cmd.GetCapacityBytes(); c != 0 {
		v.CapacityBytes = c
	}
}

// CheckModify checks a volume_modify command against v as stored.
func CheckModify(v *statepb.Volume, cmd *statepb.VolumeModifyCommand) error {
	if cmd.GetVolumeIndex() != v.GetModifyIndex() {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("volume %q changed at index %d after the modification was decided at index %d", v.GetId(), v.GetModifyIndex(), cmd.GetVolumeIndex()))
	}
	if len(cmd.GetMutableParameters()) == 0 {
		return status.Errorf(codes.InvalidArgument, "modify volume %q: no mutable parameters", v.GetId())
	}
	return nil
}

// MergeMutable returns the volume's mutable parameters with changes
// applied over them: ControllerModifyVolume changes only the keys it is
// given.
func MergeMutable(current, changes map[string]string) map[string]string {
	out := maps.Clone(current)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, changes)
	return out
}

// snapshotTransitions are the legal changes of a snapshot's state.
var snapshotTransitions = map[[2]string]bool{
	{SnapshotCreating, SnapshotCreating}: true, // a failed attempt recorded
	{SnapshotCreating, SnapshotCreated}:  true,
	{SnapshotCreating, SnapshotDeleting}: true, // cleanup of a create that cannot finish
	{SnapshotCreated, SnapshotCreated}:   true, // ready_to_use and size follow the plugin
	{SnapshotCreated, SnapshotDeleting}:  true,
	{SnapshotDeleting, SnapshotDeleting}: true, // a failed attempt recorded
	{SnapshotDeleting, SnapshotCreated}:  true, // the plugin refused the delete
}

// CheckSnapshotPut checks a snapshot_put command. old is the stored
// snapshot of its id (nil when none), source the stored volume it names
// (nil when none). A new snapshot (snapshot_index 0) takes a free id, of a
// known volume of the same plugin, in state creating; a change names the
// stored row's modify index and a legal state transition.
func CheckSnapshotPut(old *statepb.VolumeSnapshot, source *statepb.Volume, cmd *statepb.SnapshotPutCommand) error {
	s := cmd.GetSnapshot()
	if s.GetId() == "" {
		return status.Error(codes.InvalidArgument, "snapshot: id is required")
	}
	if cmd.GetSnapshotIndex() == 0 {
		if old != nil {
			return status.Errorf(codes.AlreadyExists, "snapshot %q already exists (volume %q)", s.GetId(), old.GetSourceVolumeId())
		}
		if source == nil {
			return status.Errorf(codes.NotFound, "snapshot %q: source volume %q not found", s.GetId(), s.GetSourceVolumeId())
		}
		if source.GetPluginId() != s.GetPluginId() {
			return status.Errorf(codes.InvalidArgument, "snapshot %q: plugin %q is not its volume's plugin %q", s.GetId(), s.GetPluginId(), source.GetPluginId())
		}
		if s.GetState() != SnapshotCreating {
			return status.Errorf(codes.InvalidArgument, "snapshot %q: a new snapshot is %s, not %q", s.GetId(), SnapshotCreating, s.GetState())
		}
		return nil
	}
	if old == nil {
		return status.Errorf(codes.NotFound, "snapshot %q not found", s.GetId())
	}
	if old.GetModifyIndex() != cmd.GetSnapshotIndex() {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("snapshot %q changed at index %d after the change was decided at index %d", s.GetId(), old.GetModifyIndex(), cmd.GetSnapshotIndex()))
	}
	if !snapshotTransitions[[2]string{old.GetState(), s.GetState()}] {
		return status.Errorf(codes.FailedPrecondition, "snapshot %q cannot go from %s to %s", s.GetId(), old.GetState(), s.GetState())
	}
	if s.GetSourceVolumeId() != old.GetSourceVolumeId() || s.GetPluginId() != old.GetPluginId() {
		return status.Errorf(codes.InvalidArgument, "snapshot %q: its volume and plugin do not change", s.GetId())
	}
	return nil
}

// CheckSnapshotDelete checks a snapshot_delete command against the stored
// snapshot: it exists and, when snapshotIndex is not 0, has not changed
// since the leader decided.
func CheckSnapshotDelete(old *statepb.VolumeSnapshot, id string, snapshotIndex uint64) error {
	if old == nil {
		return status.Errorf(codes.NotFound, "snapshot %q not found", id)
	}
	if snapshotIndex != 0 && old.GetModifyIndex() != snapshotIndex {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("snapshot %q changed at index %d after the delete was decided at index %d", id, old.GetModifyIndex(), snapshotIndex))
	}
	return nil
}

// CheckDeleteWithSnapshots refuses to delete volume v while one of its
// snapshots is still being created: the plugin needs the volume to finish
// it.
func CheckDeleteWithSnapshots(v *statepb.Volume, snapshots []*statepb.VolumeSnapshot) error {
	for _, s := range snapshots {
		if s.GetSourceVolumeId() == v.GetId() && s.GetState() == SnapshotCreating {
			return status.Errorf(codes.FailedPrecondition, "volume %q: snapshot %q is still being created", v.GetId(), s.GetId())
		}
	}
	if e := v.GetExpansion(); e != nil {
		return status.Errorf(codes.FailedPrecondition, "volume %q: an expansion to %d bytes is under way", v.GetId(), e.GetCapacityBytes())
	}
	return nil
}

// SnapshotNeedsWork reports whether the leader's volume watcher has work
// on snapshot s: it is being created or deleted, or is not ready to use
// yet.
func SnapshotNeedsWork(s *statepb.VolumeSnapshot) bool {
	return s.GetState() != SnapshotCreated || !s.GetReadyToUse()
}
