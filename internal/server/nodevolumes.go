package server

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// grpcNodeVolumes implements volumeops.NodeVolumesClient with the
// NodeVolumes gRPC service of the agents, over the pool of connections to
// them.
type grpcNodeVolumes struct {
	conns *connPool
}

func (g *grpcNodeVolumes) client(addr string) (csisupdv1.NodeVolumesClient, error) {
	return agentClient(g.conns, addr, csisupdv1.NewNodeVolumesClient)
}

func (g *grpcNodeVolumes) MountVolume(ctx context.Context, addr string, req *csisupdv1.MountVolumeRequest) (*csisupdv1.Mount, error) {
	c, err := g.client(addr)
	if err != nil {
		return nil, err
	}
	resp, err := c.MountVolume(ctx, req)
	if err != nil {
		return nil, agentError(addr, err)
	}
	return resp.GetMount(), nil
}

func (g *grpcNodeVolumes) UnmountVolume(ctx context.Context, addr string, req *csisupdv1.UnmountVolumeRequest) error {
	c, err := g.client(addr)
	if err != nil {
		return err
	}
	_, err = c.UnmountVolume(ctx, req)
	return agentError(addr, err)
}

func (g *grpcNodeVolumes) ExpandVolume(ctx context.Context, addr string, req *csisupdv1.ExpandVolumeRequest) (int64, error) {
	c, err := g.client(addr)
	if err != nil {
		return 0, err
	}
	resp, err := c.ExpandVolume(ctx, req)
	if err != nil {
		return 0, agentError(addr, err)
	}
	return resp.GetCapacityBytes(), nil
}

func (g *grpcNodeVolumes) VolumeHealth(ctx context.Context, addr string, req *csisupdv1.VolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	c, err := g.client(addr)
	if err != nil {
		return nil, err
	}
	resp, err := c.VolumeHealth(ctx, req)
	if err != nil {
		return nil, agentError(addr, err)
	}
	return resp.GetResponse(), nil
}

func (g *grpcNodeVolumes) ListMounts(ctx context.Context, addr string, req *csisupdv1.ListMountsRequest) ([]*csisupdv1.Mount, error) {
	c, err := g.client(addr)
	if err != nil {
		return nil, err
	}
	resp, err := c.ListMounts(ctx, req)
	if err != nil {
		return nil, agentError(addr, err)
	}
	return resp.GetMounts(), nil
}

// agentNotReachedError is the error of a NodeVolumes call that reached no
// agent at addr (csisupdv1.NotReached): the agent is down or cannot be
// reached. It keeps the call's status.
type agentNotReachedError struct {
	addr string
	err  error
}

func (e *agentNotReachedError) Error() string              { return e.err.Error() }
func (e *agentNotReachedError) Unwrap() error              { return e.err }
func (e *agentNotReachedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// agentError marks the error of a call to the agent at addr that reached
// no agent.
func agentError(addr string, err error) error {
	if csisupdv1.NotReached(err) {
		return &agentNotReachedError{addr: addr, err: err}
	}
	return err
}

// nodeUnreachable turns the error of a volume request whose call to the
// agent of node nodeID reached no agent into Unavailable with the
// NodeUnreachable detail naming the node, which the CLI tells apart from
// an answer of the agent. Any other error is returned as it is.
func (c *controlService) nodeUnreachable(nodeID string, err error) error {
	var nr *agentNotReachedError
	if !errors.As(err, &nr) {
		return err
	}
	// Only the agent of the request's node: a controller call goes to
	// another node's agent.
	if node := c.s.State().Node(nodeID); node == nil || node.GetAddress() != nr.addr {
		return err
	}
	return csisupdv1.NewNodeUnreachableError(nodeID, nr.addr, err)
}
