package rules

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// syncClaim is a claim of workload w on node n by owner, at claim index
// idx, in state.
func syncClaim(n, w, owner string, idx uint64, state string) *statepb.VolumeClaim {
	c := claimOn(n, w, mnmw, false)
	c.Owner, c.ClaimIndex, c.State = owner, idx, state
	return c
}

// names lists refs as volume/workload@index.
func names(refs []IndexedRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, fmt.Sprintf("%s/%s@%d", r.VolumeID, r.WorkloadID, r.ClaimIndex))
	}
	return out
}

// TestSyncSelect checks which claims a sync releases and which it keeps by
// index: only the owner's taken claims on the node, of workloads not
// listed, at or below known_index; every one of them kept at known_index
// 0.
func TestSyncSelect(t *testing.T) {
	volumes := []*statepb.Volume{
		{Id: "vb", Claims: []*statepb.VolumeClaim{
			syncClaim("n1", "w2", "nomad", 10, StateTaken),
			syncClaim("n1", "w1", "nomad", 11, StateTaken),
			syncClaim("n2", "w3", "nomad", 12, StateTaken), // another node
		}},
		{Id: "va", Claims: []*statepb.VolumeClaim{
			syncClaim("n1", "w4", "nomad", 20, StateTaken),          // taken after known_index 15
			syncClaim("n1", "w5", "docker", 5, StateTaken),          // another owner
			syncClaim("n1", "w6", "", 5, StateTaken),                // no owner
			syncClaim("n1", "w7", "nomad", 6, StateUnpublishing),    // released already
			syncClaim("n1", "w8", "nomad", 7, StateNodeUnpublished), // released already
			syncClaim("n1", "w9", "nomad", 15, StateTaken),          // at known_index
		}},
	}
	tests := []struct {
		name        string
		node, owner string
		live        []string
		known       uint64
		release     []string
		kept        []string
	}{
		{"one of three live", "n1", "nomad", []string{"w1"}, 15, []string{"va/w9@15", "vb/w2@10"}, []string{"va/w4@20"}},
		{"all live", "n1", "nomad", []string{"w1", "w2", "w4", "w9"}, 15, nil, nil},
		{"none live, everything known", "n1", "nomad", nil, 100, []string{"va/w4@20", "va/w9@15", "vb/w1@11", "vb/w2@10"}, nil},
		{"known index 0 keeps every claim", "n1", "nomad", nil, 0, nil, []string{"va/w4@20", "va/w9@15", "vb/w1@11", "vb/w2@10"}},
		{"another owner", "n1", "docker", nil, 100, []string{"va/w5@5"}, nil},
		{"an empty owner syncs nothing", "n1", "", nil, 100, nil, nil},
		{"another node", "n2", "nomad", nil, 100, []string{"vb/w3@12"}, nil},
		{"a node without claims", "n3", "nomad", nil, 100, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release, kept := SyncSelect(volumes, tt.node, tt.owner, tt.live, tt.known)
			if got := names(release); !slices.Equal(got, tt.release) {
				t.Errorf("released %v, want %v", got, tt.release)
			}
			if got := names(kept); !slices.Equal(got, tt.kept) {
				t.Errorf("kept by index %v, want %v", got, tt.kept)
			}
			for _, r := range append(release, kept...) {
				if r.NodeID != tt.node {
					t.Errorf("%v is on another node than %s", r, tt.node)
				}
			}
		})
	}
}

// TestCheckSyncRequest checks the refusals of a sync's fields.
func TestCheckSyncRequest(t *testing.T) {
	tests := []struct {
		name string
		req  *csisupdv1.SyncNodeClaimsRequest
		ok   bool
	}{
		{"complete", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "nomad", WorkloadIds: []string{"w1", "alloc.2"}}, true},
		{"no workloads: none alive", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "nomad"}, true},
		{"no node", &csisupdv1.SyncNodeClaimsRequest{Owner: "nomad"}, false},
		{"no owner", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1"}, false},
		{"owner not an id", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "my scheduler"}, false},
		{"workload with a slash", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "nomad", WorkloadIds: []string{"w1", "a/b"}}, false},
		{"workload dot dot", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "nomad", WorkloadIds: []string{".."}}, false},
		{"empty workload", &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "nomad", WorkloadIds: []string{""}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSyncRequest(tt.req)
			if tt.ok != (err == nil) {
				t.Fatalf("CheckSyncRequest: %v, want ok %v", err, tt.ok)
			}
			if err != nil && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("CheckSyncRequest: %v, want InvalidArgument", err)
			}
		})
	}
}
