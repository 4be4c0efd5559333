package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/server/claims"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/prometheus/client_golang/prometheus"
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
	idx, err := c.node.ApplyBatched(&statepb.LogEntry{Command: &statepb.LogEntry_NodeUpsert{NodeUpsert: &statepb.ClusterNode{
		Id: req.GetNodeId(), Name: req.GetName(), Address: req.GetAddress(), Plugins: statepb.PluginsFromAPI(req.GetPlugins()),
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
	if c.state().Node(req.GetNodeId()) == nil {
		return nil, status.Errorf(codes.NotFound, "node %q is not registered", req.GetNodeId())
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
	node := c.state().Node(req.GetNodeId())
	if node == nil {
		return nil, status.Errorf(codes.NotFound, "node %q is not registered", req.GetNodeId())
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
			return claims.NodeClaims(st.LatestIndex(), st.Volumes(""), req.GetNodeId()), nil
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
	if c.state().Node(req.GetNodeId()) == nil {
		return nil, status.Errorf(codes.NotFound, "node %q is not registered", req.GetNodeId())
	}
	if n := len(req.GetMessage()); n > claims.MaxHealthMessage {
		return nil, status.Errorf(codes.InvalidArgument, "node volume health: message of %d bytes is over %d", n, claims.MaxHealthMessage)
	}
	v := c.state().Volume(req.GetVolumeId())
	if v == nil {
		return &csisupdv1.NodeVolumeHealthResponse{}, nil // forgotten meanwhile: nothing to record
	}
	if err := recordHealth(c.node, v, req.GetNodeId(), req.GetAbnormal(), req.GetMessage()); err != nil {
		return nil, err
	}
	return &csisupdv1.NodeVolumeHealthResponse{}, nil
}
