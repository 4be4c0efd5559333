package server

import (
	"context"
	"errors"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/server/volumeops"
)

// clusterService implements csisupd.v1.Cluster.
type clusterService struct {
	csisupdv1.UnimplementedClusterServer
	id         string
	fwd        *forwarder
	node       *raftnode.Node
	state      func() *state.Store
	heartbeats *leader.Heartbeats
	// beats counts the node heartbeats this server handles as leader.
	beats prometheus.Counter
	// ops records the volume health the nodes report.
	ops *volumeops.Ops
	// leases renews the leases of a node's own claims.
	leases *leader.Leases
}

func (c *clusterService) PeerInfo(ctx context.Context, _ *csisupdv1.PeerInfoRequest) (*csisupdv1.PeerInfoResponse, error) {
	return c.node.SelfInfo(), nil
}

func (c *clusterService) Join(ctx context.Context, req *csisupdv1.JoinRequest) (*csisupdv1.JoinResponse, error) {
	if !c.node.IsLeader() {
		return nil, status.Errorf(codes.FailedPrecondition, "server %s is not the leader", c.id)
	}
	if err := c.node.HandleJoin(req); err != nil {
		return nil, toStatus(err)
	}
	return &csisupdv1.JoinResponse{}, nil
}

func (c *clusterService) ServerStats(ctx context.Context, _ *csisupdv1.ServerStatsRequest) (*csisupdv1.ServerStatsResponse, error) {
	return c.node.ServerStats(), nil
}

func (c *clusterService) NodeRegister(ctx context.Context, req *csisupdv1.NodeRegisterRequest) (*csisupdv1.NodeRegisterResponse, error) {
	if req.GetNodeId() == "" || req.GetAddress() == "" {
		return nil, status.Error(codes.InvalidArgument, "node register: node_id and address are required")
	}
	fctx, conn, err := c.fwd.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return csisupdv1.NewClusterClient(conn).NodeRegister(fctx, req)
	}
	hash, err := presentedSecret(ctx)
	if err != nil {
		return nil, err
	}
	// The FSM decides again when it applies the registration; this refuses
	// early, with the same rule, and checks what only the caller's
	// credentials can say: the node it may act as.
	st := c.state()
	existing := st.Node(req.GetNodeId())
	if _, err := rules.CheckNodeRegister(req.GetNodeId(), req.GetName(), hash, existing, st.NodesNamed(req.GetName())); err != nil {
		return nil, err
	}
	if err := checkCallerNode(ctx, req.GetNodeId(), req.GetName()); err != nil {
		return nil, err
	}
	if existing != nil && existing.GetName() != req.GetName() {
		if err := checkCallerNode(ctx, req.GetNodeId(), existing.GetName()); err != nil {
			return nil, err
		}
	}
	idx, err := c.node.ApplyBatched(&statepb.LogEntry{Command: &statepb.LogEntry_NodeUpsert{NodeUpsert: &statepb.ClusterNode{
		Id: req.GetNodeId(), Name: req.GetName(), Address: req.GetAddress(), Plugins: statepb.PluginsFromAPI(req.GetPlugins()),
		SecretHash: hash,
	}}})
	if err != nil {
		return nil, toStatus(err)
	}
	ttl := c.heartbeats.Reset(req.GetNodeId())
	return &csisupdv1.NodeRegisterResponse{HeartbeatTtlMs: ttl.Milliseconds(), Index: idx}, nil
}

func (c *clusterService) NodeUpdatePlugins(ctx context.Context, req *csisupdv1.NodeUpdatePluginsRequest) (*csisupdv1.NodeUpdatePluginsResponse, error) {
	fctx, conn, err := c.fwd.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return csisupdv1.NewClusterClient(conn).NodeUpdatePlugins(fctx, req)
	}
	if _, err := c.actAs(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	idx, err := c.node.ApplyBatched(&statepb.LogEntry{Command: &statepb.LogEntry_NodePlugins{NodePlugins: &statepb.NodePluginsCommand{
		NodeId: req.GetNodeId(), Plugins: statepb.PluginsFromAPI(req.GetPlugins()),
	}}})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csisupdv1.NodeUpdatePluginsResponse{Index: idx}, nil
}

func (c *clusterService) NodeHeartbeat(ctx context.Context, req *csisupdv1.NodeHeartbeatRequest) (*csisupdv1.NodeHeartbeatResponse, error) {
	fctx, conn, err := c.fwd.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return csisupdv1.NewClusterClient(conn).NodeHeartbeat(fctx, req)
	}
	c.beats.Inc()
	node, err := c.actAs(ctx, req.GetNodeId())
	if err != nil {
		return nil, err
	}
	if node.GetStatus() != state.NodeStatusReady {
		_, err := c.node.ApplyBatched(&statepb.LogEntry{Command: &statepb.LogEntry_NodeStatus{NodeStatus: &statepb.NodeStatusCommand{
			NodeId: node.GetId(), Status: state.NodeStatusReady, Description: "heartbeat received",
		}}})
		if err != nil {
			return nil, toStatus(err)
		}
	}
	ttl := c.heartbeats.Reset(req.GetNodeId())
	return &csisupdv1.NodeHeartbeatResponse{HeartbeatTtlMs: ttl.Milliseconds()}, nil
}

// NodeClaims answers from the leader's state: the claims of the node
// that are not released without it, and the index they were read at.
func (c *clusterService) NodeClaims(ctx context.Context, req *csisupdv1.NodeClaimsRequest) (*csisupdv1.NodeClaimsResponse, error) {
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node claims: node_id is required")
	}
	return routeVia(ctx, c.fwd, false, true, csisupdv1.NewClusterClient,
		func(ctx context.Context, cl csisupdv1.ClusterClient) (*csisupdv1.NodeClaimsResponse, error) {
			return cl.NodeClaims(ctx, req)
		},
		func() (*csisupdv1.NodeClaimsResponse, error) {
			st := c.state()
			// A node that never registered holds no claims, and the
			// answer says no more than that; its agent asks at start,
			// before its registration may have gone through.
			if st.Node(req.GetNodeId()) == nil {
				return &csisupdv1.NodeClaimsResponse{Index: st.LatestIndex()}, nil
			}
			if _, err := c.actAs(ctx, req.GetNodeId()); err != nil {
				return nil, err
			}
			return rules.NodeClaims(st.LatestIndex(), st.Volumes(""), req.GetNodeId()), nil
		})
}

// ResolveToken answers from this server's replicated state, so any server
// can: the token of secret_id, without its secret, and the policies it
// names that exist, in its order. An empty secret_id resolves the
// anonymous policy: no token, and the policy named acl.AnonymousPolicy
// when there is one. An unknown secret is NotFound.
func (c *clusterService) ResolveToken(ctx context.Context, req *csisupdv1.ResolveTokenRequest) (*csisupdv1.ResolveTokenResponse, error) {
	_, tok, policies, err := c.state().ResolveToken(req.GetSecretId())
	if err != nil {
		if errors.Is(err, acl.ErrTokenNotFound) {
			return nil, status.Error(codes.NotFound, "acl token not found")
		}
		return nil, toStatus(err)
	}
	return &csisupdv1.ResolveTokenResponse{Token: statepb.ACLTokenView(tok), Policies: statepb.ACLPoliciesToAPI(policies)}, nil
}

func (c *clusterService) NodeVolumeHealth(ctx context.Context, req *csisupdv1.NodeVolumeHealthRequest) (*csisupdv1.NodeVolumeHealthResponse, error) {
	fctx, conn, err := c.fwd.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return csisupdv1.NewClusterClient(conn).NodeVolumeHealth(fctx, req)
	}
	if _, err := c.actAs(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	if n := len(req.GetMessage()); n > rules.MaxHealthMessage {
		return nil, status.Errorf(codes.InvalidArgument, "node volume health: message of %d bytes is over %d", n, rules.MaxHealthMessage)
	}
	v := c.state().Volume(req.GetVolumeId())
	if v == nil {
		return &csisupdv1.NodeVolumeHealthResponse{}, nil // forgotten meanwhile: nothing to record
	}
	// A node speaks only of the volumes it holds claims on.
	if !slices.ContainsFunc(v.GetClaims(), func(cl *statepb.VolumeClaim) bool { return cl.GetNodeId() == req.GetNodeId() }) {
		return nil, status.Errorf(codes.PermissionDenied, "node %q has no claim on volume %q: it may report the health of its own volumes only", req.GetNodeId(), req.GetVolumeId())
	}
	if err := c.ops.RecordHealth(v, req.GetNodeId(), req.GetAbnormal(), req.GetMessage()); err != nil {
		return nil, err
	}
	return &csisupdv1.NodeVolumeHealthResponse{}, nil
}

// actAs checks, on the leader, that the caller may act as node nodeID: it
// presents the node's secret, and its credentials (a token's node
// identity, a certificate's node name) allow the node's name. It returns
// the node's record.
func (c *clusterService) actAs(ctx context.Context, nodeID string) (*statepb.ClusterNode, error) {
	if nodeID == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	hash, err := presentedSecret(ctx)
	if err != nil {
		return nil, err
	}
	node := c.state().Node(nodeID)
	if err := rules.CheckNodeSecret(nodeID, node, hash); err != nil {
		return nil, err
	}
	if err := checkCallerNode(ctx, nodeID, node.GetName()); err != nil {
		return nil, err
	}
	return node, nil
}

// presentedSecret returns the hash of the node secret the call carries,
// or Unauthenticated when it carries none.
func presentedSecret(ctx context.Context) ([]byte, error) {
	v := metadata.ValueFromIncomingContext(ctx, csisupdv1.NodeSecretMetadataKey)
	if len(v) == 0 || v[0] == "" {
		return nil, status.Error(codes.Unauthenticated, "no node secret was presented: agents present the one in their data_dir (an agent of an earlier release? upgrade it)")
	}
	return rules.SecretHash(v[0]), nil
}

// checkCallerNode checks that the caller's credentials allow it to act
// as node nodeID, named name: a token with a node identity, and with
// tls.verify_node_name a certificate made for a node, bind their caller
// to that node's name (the Authorizer put the bindings into ctx, with
// those a forwarding server passed on).
func checkCallerNode(ctx context.Context, nodeID, name string) error {
	if err := acl.CallerNodeFromContext(ctx).Check(name); err != nil {
		return status.Errorf(codes.PermissionDenied, "node %q: %v", nodeID, err)
	}
	return nil
}
