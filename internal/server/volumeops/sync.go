package volumeops

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// SyncNodeClaims runs on the leader: it starts the release, with reason
// not_in_sync, of every claim on the node of the request's owner whose
// workload the request does not list, except those taken after
// known_index (rules.SyncSelect). Each release starts with one raft step
// under its volume's lock, from the claim as stored then; the volume
// watcher, woken, runs the release steps. The answer does not wait for
// them: a sync may name many claims on a node that does not answer, and
// the scheduler learns each claim's end from the volume's status or the
// cluster events. It lists the claims whose release it started and those
// it kept because of known_index; claims being released already are in
// neither list.
func (o *Ops) SyncNodeClaims(ctx context.Context, req *csisupdv1.SyncNodeClaimsRequest) (*csisupdv1.SyncNodeClaimsResponse, error) {
	if err := rules.CheckSyncRequest(req); err != nil {
		return nil, err
	}
	if o.cfg.State().Node(req.GetNodeId()) == nil {
		return nil, status.Errorf(codes.NotFound, "sync node claims: node %q not found", req.GetNodeId())
	}
	release, kept := rules.SyncSelect(o.cfg.State().Volumes(""), req.GetNodeId(), req.GetOwner(), req.GetWorkloadIds(), req.GetKnownIndex())
	resp := &csisupdv1.SyncNodeClaimsResponse{}
	// The claims of a volume released from that volume's lock replace its
	// kept claims of the first read: both come from the state under it.
	lockedKept := map[string][]rules.IndexedRef{}
	for _, ref := range release {
		if _, done := lockedKept[ref.VolumeID]; done {
			continue
		}
		started, keptNow, err := o.syncVolume(ctx, ref.VolumeID, req)
		// What was started is answered even after a failure: the caller
		// learns which releases are under way.
		for _, r := range started {
			resp.Released = append(resp.Released, rules.ClaimRefToAPI(r))
		}
		if len(started) > 0 {
			o.cfg.KickWatcher()
		}
		if err != nil {
			return resp, err
		}
		lockedKept[ref.VolumeID] = keptNow
	}
	for _, ref := range kept {
		if _, locked := lockedKept[ref.VolumeID]; !locked {
			resp.KeptByIndex = append(resp.KeptByIndex, rules.ClaimRefToAPI(ref))
		}
	}
	for _, refs := range lockedKept {
		for _, ref := range refs {
			resp.KeptByIndex = append(resp.KeptByIndex, rules.ClaimRefToAPI(ref))
		}
	}
	sortClaimRefs(resp.KeptByIndex)
	if len(resp.GetReleased()) == 0 {
		// Answered from this server's state alone.
		if err := o.confirmLeader(); err != nil {
			return nil, err
		}
	}
	o.logger.Info("node claims synced", "node", req.GetNodeId(), "owner", req.GetOwner(), "live_workloads", len(req.GetWorkloadIds()),
		"known_index", req.GetKnownIndex(), "released", len(resp.GetReleased()), "kept_by_index", len(resp.GetKeptByIndex()))
	return resp, nil
}

// syncVolume starts, under the lock of volume id, the release of each
// claim of the volume that the sync of req selects from the volume as
// stored under the lock. It returns the claims whose release it started
// and those it keeps because of known_index. A claim the FSM refuses as
// stale changed since it was read (released, or taken again): it is
// skipped.
func (o *Ops) syncVolume(ctx context.Context, id string, req *csisupdv1.SyncNodeClaimsRequest) (started, kept []rules.IndexedRef, err error) {
	v, unlock, err := o.lockVolume(ctx, id)
	if status.Code(err) == codes.NotFound {
		return nil, nil, nil // deleted since: nothing of it to release
	}
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	var release []rules.IndexedRef
	release, kept = rules.SyncSelect([]*statepb.Volume{v}, req.GetNodeId(), req.GetOwner(), req.GetWorkloadIds(), req.GetKnownIndex())
	for _, ref := range release {
		v, c := o.readClaim(ref.Ref)
		if c == nil || c.GetClaimIndex() != ref.ClaimIndex || c.GetState() != rules.StateTaken {
			continue
		}
		if _, _, err := o.stepClaim(rules.StartRelease(v, c, rules.ReasonNotInSync)); err != nil {
			if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); ok && d.GetRule() == csisupdv1.ClaimRuleStale {
				continue
			}
			return started, kept, err
		}
		o.logger.Info("volume claim not in sync; releasing it", "volume", ref.VolumeID, "node", ref.NodeID,
			"workload", ref.WorkloadID, "owner", req.GetOwner(), "claim_index", ref.ClaimIndex)
		started = append(started, ref)
	}
	return started, kept, nil
}

// sortClaimRefs sorts claims by volume and workload.
func sortClaimRefs(refs []*csisupdv1.ClaimRef) {
	slices.SortFunc(refs, func(a, b *csisupdv1.ClaimRef) int {
		return cmp.Or(strings.Compare(a.GetVolumeId(), b.GetVolumeId()), strings.Compare(a.GetWorkloadId(), b.GetWorkloadId()))
	})
}
