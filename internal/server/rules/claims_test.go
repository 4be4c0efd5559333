package rules

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func TestNodeGoneDue(t *testing.T) {
	grace := time.Minute
	// The node's replicated status time says it went down long ago (a
	// leader's clock that ran ahead): only downFor, the caller's own
	// measure, counts.
	down := &statepb.ClusterNode{Id: "n", Status: state.NodeStatusDown, StatusUpdatedAt: timestamppb.New(time.Unix(0, 0))}
	ready := &statepb.ClusterNode{Id: "n", Status: state.NodeStatusReady, StatusUpdatedAt: timestamppb.New(time.Unix(0, 0))}
	tests := []struct {
		name    string
		claim   *statepb.VolumeClaim
		node    *statepb.ClusterNode
		downFor time.Duration
		want    bool
	}{
		{"taken, node seen down past the grace", &statepb.VolumeClaim{State: StateTaken}, down, 2 * time.Minute, true},
		{"unpublishing, node seen down past the grace", &statepb.VolumeClaim{State: StateUnpublishing}, down, 2 * time.Minute, true},
		{"taken, node seen down within the grace, whatever its status time", &statepb.VolumeClaim{State: StateTaken}, down, 30 * time.Second, false},
		{"taken, node not seen down yet", &statepb.VolumeClaim{State: StateTaken}, down, 0, false},
		{"taken, node ready", &statepb.VolumeClaim{State: StateTaken}, ready, time.Hour, false},
		{"taken, node not known", &statepb.VolumeClaim{State: StateTaken}, nil, 0, true},
		{"node-unpublished: past the node's step", &statepb.VolumeClaim{State: StateNodeUnpublished}, nil, time.Hour, false},
		{"released without its node already", &statepb.VolumeClaim{State: StateUnpublishing, NodeGone: true}, nil, time.Hour, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NodeGoneDue(tt.claim, tt.node, tt.downFor, grace); got != tt.want {
				t.Fatalf("NodeGoneDue = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSharedPublicationPrefersReadWrite(t *testing.T) {
	claim := &statepb.VolumeClaim{NodeId: "n", WorkloadId: "new", ReadOnly: true}
	ro := &statepb.VolumeClaim{NodeId: "n", WorkloadId: "ro", ReadOnly: true, ControllerPublished: true}
	rw := &statepb.VolumeClaim{NodeId: "n", WorkloadId: "rw", ControllerPublished: true}
	elsewhere := &statepb.VolumeClaim{NodeId: "m", WorkloadId: "x", ControllerPublished: true}
	v := &statepb.Volume{Claims: []*statepb.VolumeClaim{elsewhere, ro, rw, claim}}
	if got := SharedPublication(v, claim); got != rw {
		t.Fatalf("shared publication %v, want the read-write one", got)
	}
	v.Claims = []*statepb.VolumeClaim{elsewhere, claim}
	if got := SharedPublication(v, claim); got != nil {
		t.Fatalf("shared publication %v, want none on another node", got)
	}
	if OthersOnNode(v, claim) {
		t.Fatal("OthersOnNode: the other claim is on another node")
	}
}

func TestUsageDefaults(t *testing.T) {
	v := &statepb.Volume{Capabilities: []*statepb.VolumeCapability{{AccessType: "block", AccessMode: "MULTI_NODE_READER_ONLY"}}}
	u, err := Usage(v, &csisupdv1.VolumeClaimRequest{})
	if err != nil || u.GetAccessType() != "block" || u.GetAccessMode() != "MULTI_NODE_READER_ONLY" {
		t.Fatalf("usage without one asked: %v, %v; want the volume's first capability", u, err)
	}
	u, err = Usage(&statepb.Volume{}, &csisupdv1.VolumeClaimRequest{Usage: &csisupdv1.VolumeUsage{ReadOnly: true}})
	if err != nil || u.GetAccessType() != "mount" || u.GetAccessMode() != "SINGLE_NODE_WRITER" || !u.GetReadOnly() {
		t.Fatalf("usage with defaults: %v, %v", u, err)
	}
	_, err = Usage(&statepb.Volume{}, &csisupdv1.VolumeClaimRequest{Usage: &csisupdv1.VolumeUsage{AccessType: "block", FsType: "ext4"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("block usage with an fs_type: %v, want InvalidArgument", err)
	}
}

func TestScrubSecrets(t *testing.T) {
	got := ScrubSecrets("denied for key s3cret and s3cret", map[string]string{"key": "s3cret", "empty": ""})
	if got != "denied for key [redacted] and [redacted]" {
		t.Fatalf("scrubbed %q", got)
	}
}

func TestCheckNodeGone(t *testing.T) {
	ref := Ref{VolumeID: "v", NodeID: "n1", WorkloadID: "w"}
	tests := []struct {
		name string
		node *statepb.ClusterNode
		ok   bool
	}{
		{"no such node", nil, true},
		{"down", &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusDown}, true},
		{"ready", &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusReady}, false},
		{"initializing", &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusInitializing}, false},
	}
	for _, tt := range tests {
		err := CheckNodeGone(tt.node, ref)
		if (err == nil) != tt.ok {
			t.Errorf("%s: CheckNodeGone = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "n1")) {
			t.Errorf("%s: error %v is not FailedPrecondition naming the node", tt.name, err)
		}
	}
}
