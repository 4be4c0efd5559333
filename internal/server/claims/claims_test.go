package claims

import (
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
	now := time.Unix(1000, 0)
	grace := time.Minute
	down := func(ago time.Duration) *statepb.ClusterNode {
		return &statepb.ClusterNode{Id: "n", Status: state.NodeStatusDown, StatusUpdatedAt: timestamppb.New(now.Add(-ago))}
	}
	ready := &statepb.ClusterNode{Id: "n", Status: state.NodeStatusReady, StatusUpdatedAt: timestamppb.New(now.Add(-time.Hour))}
	tests := []struct {
		name  string
		claim *statepb.VolumeClaim
		node  *statepb.ClusterNode
		want  bool
	}{
		{"taken, node down past the grace", &statepb.VolumeClaim{State: StateTaken}, down(2 * time.Minute), true},
		{"unpublishing, node down past the grace", &statepb.VolumeClaim{State: StateUnpublishing}, down(2 * time.Minute), true},
		{"taken, node down within the grace", &statepb.VolumeClaim{State: StateTaken}, down(30 * time.Second), false},
		{"taken, node ready", &statepb.VolumeClaim{State: StateTaken}, ready, false},
		{"taken, node not known", &statepb.VolumeClaim{State: StateTaken}, nil, true},
		{"node-unpublished: past the node's step", &statepb.VolumeClaim{State: StateNodeUnpublished}, nil, false},
		{"released without its node already", &statepb.VolumeClaim{State: StateUnpublishing, NodeGone: true}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NodeGoneDue(tt.claim, tt.node, now, grace); got != tt.want {
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
