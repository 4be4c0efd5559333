package rules

import (
	"cmp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The rules of a scheduler's sync of a node (Control.SyncNodeClaims): the
// scheduler names every workload of its own (owner) alive on the node,
// and each claim of that owner on the node whose workload it does not name
// is released with ReasonNotInSync. A claim taken after known_index (the
// index up to which the scheduler's list is complete) is kept: the list
// may not know it yet. known_index 0 means the caller knows no index, so
// every claim is kept: a sync never releases a claim on a guess.

// IndexedRef names one claim with the claim_index it had when it was
// read, so that a release started from it applies to that claim only.
type IndexedRef struct {
	Ref
	ClaimIndex uint64
}

// CheckSyncRequest checks the fields of a sync that need no state: the
// node id, the owner (required: claims without one are never synced) and
// each workload id, as a claim request's are checked. Its errors are
// InvalidArgument naming the field.
func CheckSyncRequest(req *csisupdv1.SyncNodeClaimsRequest) error {
	switch {
	case req.GetNodeId() == "":
		return status.Error(codes.InvalidArgument, "sync node claims: node_id is required")
	case req.GetOwner() == "":
		return status.Error(codes.InvalidArgument, "sync node claims: owner is required: claims without an owner are never synced")
	case !ids.ValidPluginID(req.GetOwner()):
		return status.Errorf(codes.InvalidArgument, "sync node claims: owner %q must match %s", req.GetOwner(), ids.PluginIDPattern)
	}
	for i, w := range req.GetWorkloadIds() {
		if !ids.ValidPathID(w) {
			return status.Errorf(codes.InvalidArgument, "sync node claims: workload_ids[%d] %q must match %s and not be . or ..", i, w, ids.PluginIDPattern)
		}
	}
	return nil
}

// SyncSelect picks, among the claims of volumes on node nodeID held by
// owner whose workload is not in live, those a sync releases and those it
// keeps because they were taken after knownIndex (all of them when
// knownIndex is 0). Only taken claims are picked: a claim being released
// already is neither released again nor kept. Claims of other owners, or
// of none, are never picked. Both lists are sorted by volume and workload.
func SyncSelect(volumes []*statepb.Volume, nodeID, owner string, live []string, knownIndex uint64) (release, kept []IndexedRef) {
	if owner == "" {
		return nil, nil
	}
	for _, v := range volumes {
		for _, c := range v.GetClaims() {
			if c.GetNodeId() != nodeID || c.GetOwner() != owner || c.GetState() != StateTaken || slices.Contains(live, c.GetWorkloadId()) {
				continue
			}
			ref := IndexedRef{Ref: RefOf(v.GetId(), c), ClaimIndex: c.GetClaimIndex()}
			if knownIndex == 0 || c.GetClaimIndex() > knownIndex {
				kept = append(kept, ref)
			} else {
				release = append(release, ref)
			}
		}
	}
	byClaim := func(a, b IndexedRef) int {
		return cmp.Or(strings.Compare(a.VolumeID, b.VolumeID), strings.Compare(a.WorkloadID, b.WorkloadID))
	}
	slices.SortFunc(release, byClaim)
	slices.SortFunc(kept, byClaim)
	return release, kept
}

// ClaimRefToAPI returns the API's name of a claim.
func ClaimRefToAPI(r IndexedRef) *csisupdv1.ClaimRef {
	return &csisupdv1.ClaimRef{VolumeId: r.VolumeID, NodeId: r.NodeID, WorkloadId: r.WorkloadID, ClaimIndex: r.ClaimIndex}
}
