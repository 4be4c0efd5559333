package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
)

// nodeCall is how one Cluster method is checked against the node that
// calls it.
type nodeCall struct {
	// serverOnly: no node may call it at all; the Authorizer refuses every
	// certificate but a server's (acl.RuleFor), so no node id is involved.
	serverOnly bool
	// noNode: the method names no node, so there is nothing to check it
	// against; why says what keeps it harmless.
	noNode bool
	why    string
	// call calls the method for node (as the caller whose secret ctx
	// carries); forOther is the code a call for another node gets, and
	// msg a part of its message.
	call     func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error
	forOther codes.Code
	msg      string
}

// clusterMethodChecks has a row for every method of the Cluster service.
// TestEveryClusterMethodActsOnlyForItsNode fails when a method is added to
// the service without one.
var clusterMethodChecks = map[string]nodeCall{
	csisupdv1.Cluster_PeerInfo_FullMethodName:    {serverOnly: true},
	csisupdv1.Cluster_Join_FullMethodName:        {serverOnly: true},
	csisupdv1.Cluster_ServerStats_FullMethodName: {serverOnly: true},
	csisupdv1.Cluster_ResolveToken_FullMethodName: {noNode: true,
		why: "answers about the token whose secret the caller already holds, never about a node"},
	csisupdv1.Cluster_NodeRegister_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeRegister(ctx, &csisupdv1.NodeRegisterRequest{NodeId: node, Name: "name-" + node, Address: "127.0.0.1:1"})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
	csisupdv1.Cluster_NodeUpdatePlugins_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeUpdatePlugins(ctx, &csisupdv1.NodeUpdatePluginsRequest{NodeId: node})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
	csisupdv1.Cluster_NodeHeartbeat_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeHeartbeat(ctx, &csisupdv1.NodeHeartbeatRequest{NodeId: node})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
	csisupdv1.Cluster_NodeClaims_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeClaims(ctx, &csisupdv1.NodeClaimsRequest{NodeId: node})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
	csisupdv1.Cluster_NodeRenewClaims_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeRenewClaims(ctx, &csisupdv1.RenewClaimsRequest{NodeId: node, WorkloadIds: []string{"w1"}})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
	csisupdv1.Cluster_NodeVolumeHealth_FullMethodName: {
		call: func(ctx context.Context, cl csisupdv1.ClusterClient, node string) error {
			_, err := cl.NodeVolumeHealth(ctx, &csisupdv1.NodeVolumeHealthRequest{NodeId: node, VolumeId: "vol-1", Abnormal: true, Message: "forged"})
			return err
		},
		forOther: codes.PermissionDenied, msg: "node secret does not match",
	},
}

// TestEveryClusterMethodActsOnlyForItsNode walks every method of the
// Cluster service: each one that names a node is called through a follower
// with node-b's secret for node-a, whose agent is running and holds a
// claim, and must be refused, leave node-a's record as it was, and work
// for node-a with node-a's own secret. A node reporting the health of a
// volume it holds no claim on is refused too.
func TestEveryClusterMethodActsOnlyForItsNode(t *testing.T) {
	e := newClaimEnv(t, 3, nil, map[string][]*csisupdv1.Plugin{
		"node-a": {monolith("p1", "node-a")}, "node-b": {monolith("p1", "node-b")},
	})
	ctx := context.Background()
	if _, err := e.cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.claim("vol-1", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	nodeA := func() *csisupdv1.ClusterNode {
		t.Helper()
		resp, err := e.cl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		n := resp.GetNode()
		n.ModifyIndex, n.StatusUpdatedAt = 0, nil
		return n
	}
	before := nodeA()
	cluster := csisupdv1.NewClusterClient(e.c.Conn((e.c.Leader().Index + 1) % 3))

	methods := csisupdv1.Cluster_ServiceDesc
	seen := 0
	check := func(name string) {
		full := "/" + methods.ServiceName + "/" + name
		row, ok := clusterMethodChecks[full]
		seen++
		switch {
		case !ok:
			t.Errorf("Cluster method %s has no row in clusterMethodChecks: decide how it is checked against the calling node", full)
		case row.serverOnly:
			if rule, ok := acl.RuleFor(full); !ok || rule.Peers != acl.PeerServer {
				t.Errorf("%s is listed as server-only, but its access rule lets %v call it", full, rule.Peers)
			}
		case row.noNode:
			if row.why == "" {
				t.Errorf("%s names no node: say why that is harmless", full)
			}
		default:
			err := row.call(asNode(ctx, "node-b"), cluster, "node-a")
			if status.Code(err) != row.forOther || !strings.Contains(status.Convert(err).Message(), row.msg) {
				t.Errorf("%s for node-a with node-b's secret: %v; want %s naming %q", full, err, row.forOther, row.msg)
			}
			if err := row.call(ctx, cluster, "node-a"); status.Code(err) != codes.Unauthenticated {
				t.Errorf("%s for node-a without a secret: %v; want Unauthenticated", full, err)
			}
			if after := nodeA(); !proto.Equal(after, before) {
				t.Errorf("%s for node-a with node-b's secret changed node-a:\n got  %v\n want %v", full, after, before)
			}
			if err := row.call(asNode(ctx, "node-a"), cluster, "node-a"); err != nil {
				t.Errorf("%s for node-a with node-a's secret: %v", full, err)
			}
			before = nodeA() // what node-a's own call changed
		}
	}
	for _, m := range methods.Methods {
		check(m.MethodName)
	}
	for _, s := range methods.Streams {
		check(s.StreamName)
	}
	if seen != len(clusterMethodChecks) {
		t.Errorf("clusterMethodChecks has %d rows, the service %d methods: remove the rows of methods that are gone", len(clusterMethodChecks), seen)
	}

	// A node that never registered holds no claims; its agent asks before
	// its registration went through.
	if nc, err := cluster.NodeClaims(asNode(ctx, "node-new"), &csisupdv1.NodeClaimsRequest{NodeId: "node-new"}); err != nil || len(nc.GetClaims()) != 0 {
		t.Errorf("node claims of a node that never registered: %v, %v; want none", nc, err)
	}

	// node-b speaks only of the volumes it holds claims on.
	_, err := cluster.NodeVolumeHealth(asNode(ctx, "node-b"), &csisupdv1.NodeVolumeHealthRequest{NodeId: "node-b", VolumeId: "vol-1", Abnormal: true, Message: "forged"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `node "node-b" has no claim on volume "vol-1"`) {
		t.Errorf("node-b's health report of node-a's volume: %v, want PermissionDenied", err)
	}
	vol, err := e.cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "vol-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range vol.GetVolume().GetConditions() {
		if c.GetSource() == "node-b" {
			t.Errorf("a condition from node-b was recorded: %v", c)
		}
	}
}
