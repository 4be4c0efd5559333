package server

import (
	"bytes"
	"context"
	"errors"
	"io"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/state"
)

// The operator's calls of the Control service: raft membership and
// snapshots of the replicated state.

func (c *controlService) RaftPeers(ctx context.Context, req *csisupdv1.RaftPeersRequest) (*csisupdv1.RaftPeersResponse, error) {
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.RaftPeersResponse, error) {
			return cl.RaftPeers(ctx, req)
		},
		func() (*csisupdv1.RaftPeersResponse, error) {
			return c.s.raftPeers()
		})
}

func (s *Server) raftPeers() (*csisupdv1.RaftPeersResponse, error) {
	conf, err := s.Configuration()
	if err != nil {
		return nil, toStatus(err)
	}
	_, leader := s.node.Raft().LeaderWithID()
	out := &csisupdv1.RaftPeersResponse{Term: s.Term(), Index: s.node.Raft().LastIndex()}
	// This runs on the leader, whose autopilot judges every server.
	health := s.node.PeerHealth()
	for _, srv := range conf.Servers {
		p := &csisupdv1.RaftPeer{
			Id:          string(srv.ID),
			RaftAddress: string(srv.Address),
			Leader:      srv.ID == leader,
			Suffrage:    raftnode.SuffrageName(srv.Suffrage),
		}
		if rec := s.State().Server(string(srv.ID)); rec != nil {
			p.RpcAddress = rec.GetRpcAddress()
		}
		p.LastContactMs = -1
		if h, ok := health[srv.ID]; ok {
			p.Healthy, p.LastIndex, p.LastTerm = h.Healthy, h.LastIndex, h.LastTerm
			if !h.StableSince.IsZero() {
				p.StableSince = timestamppb.New(h.StableSince)
			}
			if h.LastContact >= 0 {
				p.LastContactMs = h.LastContact.Milliseconds()
			}
		}
		out.Peers = append(out.Peers, p)
	}
	return out, nil
}

func (c *controlService) RemovePeer(ctx context.Context, req *csisupdv1.RaftRemovePeerRequest) (*csisupdv1.RaftRemovePeerResponse, error) {
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.RaftRemovePeerResponse, error) {
			return cl.RemovePeer(ctx, req)
		},
		func() (*csisupdv1.RaftRemovePeerResponse, error) {
			conf, err := c.s.Configuration()
			if err != nil {
				return nil, toStatus(err)
			}
			found := false
			for _, srv := range conf.Servers {
				found = found || string(srv.ID) == req.GetId()
			}
			if !found {
				return nil, status.Errorf(codes.NotFound, "server %q is not in the raft configuration", req.GetId())
			}
			if err := c.s.node.RaftOp(func() raft.Future { return c.s.node.Raft().RemoveServer(raft.ServerID(req.GetId()), 0, 0) }); err != nil {
				return nil, toStatus(err)
			}
			c.s.logger.Info("removed raft peer", "id", req.GetId())
			return &csisupdv1.RaftRemovePeerResponse{}, nil
		})
}

func (c *controlService) SnapshotSave(req *csisupdv1.SnapshotSaveRequest, stream grpc.ServerStreamingServer[csisupdv1.SnapshotChunk]) error {
	ctx := stream.Context()
	fctx, conn, err := c.s.fwd.leaderConn(ctx)
	if err != nil {
		return err
	}
	if conn != nil {
		up, err := csisupdv1.NewControlClient(conn).SnapshotSave(fctx, req)
		if err != nil {
			return err
		}
		for {
			chunk, err := up.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := stream.Send(chunk); err != nil {
				return err
			}
		}
	}
	if err := c.s.fwd.consistentRead(); err != nil {
		return err
	}
	data, err := state.EncodeSnapshot(c.s.State().Snapshot())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	for len(data) > 0 {
		n := min(len(data), 64<<10)
		if err := stream.Send(&csisupdv1.SnapshotChunk{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func (c *controlService) SnapshotRestore(stream grpc.ClientStreamingServer[csisupdv1.SnapshotChunk, csisupdv1.SnapshotRestoreResponse]) error {
	var buf bytes.Buffer
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if buf.Len()+len(chunk.GetData()) > maxSnapshotBytes {
			return status.Errorf(codes.InvalidArgument, "snapshot larger than %d bytes", maxSnapshotBytes)
		}
		buf.Write(chunk.GetData())
	}
	fctx, conn, err := c.s.fwd.leaderConn(stream.Context())
	if err != nil {
		return err
	}
	if conn != nil {
		up, err := csisupdv1.NewControlClient(conn).SnapshotRestore(fctx)
		if err != nil {
			return err
		}
		data := buf.Bytes()
		for len(data) > 0 {
			n := min(len(data), 64<<10)
			if err := up.Send(&csisupdv1.SnapshotChunk{Data: data[:n]}); err != nil {
				return err
			}
			data = data[n:]
		}
		resp, err := up.CloseAndRecv()
		if err != nil {
			return err
		}
		return stream.SendAndClose(resp)
	}
	idx, err := c.s.restoreSnapshot(buf.Bytes())
	if err != nil {
		return err
	}
	return stream.SendAndClose(&csisupdv1.SnapshotRestoreResponse{Index: idx})
}

// restoreSnapshot replaces the replicated state on the leader.
func (s *Server) restoreSnapshot(data []byte) (uint64, error) {
	snap, err := state.DecodeSnapshot(data)
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "snapshot is not a csisupd snapshot: %v", err)
	}
	if snap.GetVersion() != state.SnapshotVersion {
		return 0, status.Errorf(codes.InvalidArgument, "snapshot version %d is not supported", snap.GetVersion())
	}
	// Check that the state store accepts it before raft commits to it: a
	// failing FSM restore inside raft is fatal.
	if _, err := state.FromSnapshot(snap, snap.GetIndex()); err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "snapshot: %v", err)
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: snap.GetIndex(), Size: int64(len(data))}
	done, err := s.node.BeginOp()
	if err != nil {
		return 0, toStatus(err)
	}
	err = s.node.Raft().Restore(meta, bytes.NewReader(data), s.cfg.ApplyTimeout)
	done()
	if err != nil {
		return 0, toStatus(err)
	}
	// The FSM's restore has re-armed the heartbeat timers for the restored
	// nodes (leader.Heartbeats.Restored), before raft.Restore returned.
	s.logger.Info("restored snapshot", "nodes", len(snap.GetNodes()), "volumes", len(snap.GetVolumes()))
	return s.node.Raft().LastIndex(), nil
}
