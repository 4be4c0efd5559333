package server

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/server/volumeops"
	"github.com/csisupd/csisupd/internal/stream"
	"github.com/csisupd/csisupd/internal/volreq"
)

// maxSnapshotBytes bounds a snapshot accepted by SnapshotRestore.
const maxSnapshotBytes = 512 << 20

// controlService implements csisupd.v1.Control.
type controlService struct {
	csisupdv1.UnimplementedControlServer
	s *Server
	// ops runs the volume work of the calls this server answers as
	// leader.
	ops *volumeops.Ops
	// releases counts ReleaseVolume calls for defectPanic only.
	releases atomic.Int64
}

// route runs local on the ready leader (after a leadership check for
// consistent reads), or remote against the leader, or local directly for a
// stale read.
func route[Resp any](ctx context.Context, f *forwarder, stale, read bool,
	remote func(context.Context, csisupdv1.ControlClient) (Resp, error),
	local func() (Resp, error),
) (Resp, error) {
	return routeVia(ctx, f, stale, read, csisupdv1.NewControlClient, remote, local)
}

// routeVia is route for the client of any service: newClient makes it on
// the connection to the leader. A forwarded request carries this server's
// identity (its connection's credentials), never the caller's token.
func routeVia[Client, Resp any](ctx context.Context, f *forwarder, stale, read bool,
	newClient func(grpc.ClientConnInterface) Client,
	remote func(context.Context, Client) (Resp, error),
	local func() (Resp, error),
) (Resp, error) {
	var zero Resp
	if stale {
		return local()
	}
	fctx, conn, err := f.leaderConn(ctx)
	if err != nil {
		return zero, err
	}
	if conn != nil {
		return remote(fctx, newClient(conn))
	}
	if read {
		if err := f.consistentRead(); err != nil {
			return zero, err
		}
	}
	resp, err := local()
	if err != nil {
		f.markLeader(ctx)
	}
	return resp, err
}

func (c *controlService) ListPlugins(ctx context.Context, req *csisupdv1.PluginListRequest) (*csisupdv1.PluginListResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.PluginListResponse, error) {
			return cl.ListPlugins(ctx, req)
		},
		func() (*csisupdv1.PluginListResponse, error) {
			page, err := parsePage(req.GetPageSize(), req.GetNextToken())
			if err != nil {
				return nil, err
			}
			st := c.s.State()
			index := st.LatestIndex()
			plugins, next := st.PluginsPage(page.from, page.limit)
			c.s.heartbeats.View().Plugins(plugins...)
			return &csisupdv1.PluginListResponse{Plugins: pluginsToAPI(plugins), Index: index, NextToken: responseToken(next)}, nil
		})
}

func (c *controlService) GetPlugin(ctx context.Context, req *csisupdv1.PluginGetRequest) (*csisupdv1.PluginGetResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.PluginGetResponse, error) {
			return cl.GetPlugin(ctx, req)
		},
		func() (*csisupdv1.PluginGetResponse, error) {
			st := c.s.State()
			p := st.Plugin(req.GetId())
			if p == nil {
				return nil, status.Errorf(codes.NotFound, "plugin %q not found", req.GetId())
			}
			c.s.heartbeats.View().Plugins(p)
			out := pluginToAPI(p)
			for _, n := range st.Nodes() {
				if slices.Contains(n.GetDrainingPlugins(), p.ID) {
					out.DrainingNodes = append(out.DrainingNodes, n.GetId())
				}
			}
			slices.Sort(out.DrainingNodes)
			return &csisupdv1.PluginGetResponse{Plugin: out, Index: st.LatestIndex()}, nil
		})
}

// ListNodes and GetNode answer with the status the leader knows: a node
// stored ready that has not heartbeated to the leader since it took over or
// restored a snapshot is initializing. A stale read answered by a follower
// shows the stored status, which the follower cannot check.
func (c *controlService) ListNodes(ctx context.Context, req *csisupdv1.NodeListRequest) (*csisupdv1.NodeListResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.NodeListResponse, error) {
			return cl.ListNodes(ctx, req)
		},
		func() (*csisupdv1.NodeListResponse, error) {
			page, err := parsePage(req.GetPageSize(), req.GetNextToken())
			if err != nil {
				return nil, err
			}
			switch req.GetStatus() {
			case "", state.NodeStatusReady, state.NodeStatusDown, state.NodeStatusInitializing:
			default:
				return nil, status.Errorf(codes.InvalidArgument, "status %q is not one of %s, %s, %s", req.GetStatus(), state.NodeStatusReady, state.NodeStatusDown, state.NodeStatusInitializing)
			}
			st := c.s.State()
			index := st.LatestIndex()
			// The status filter sees the status this server tells, so
			// that --status initializing finds the nodes shown so.
			view := c.s.heartbeats.View()
			nodes, next := st.NodesPage(page.from, page.limit, state.NodeFilter(req.GetPluginId(), req.GetStatus(), view.Status))
			return &csisupdv1.NodeListResponse{Nodes: statepb.ClusterNodesToAPI(view.Nodes(nodes...)), Index: index, NextToken: responseToken(next)}, nil
		})
}

func (c *controlService) GetNode(ctx context.Context, req *csisupdv1.NodeGetRequest) (*csisupdv1.NodeGetResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.NodeGetResponse, error) {
			return cl.GetNode(ctx, req)
		},
		func() (*csisupdv1.NodeGetResponse, error) {
			st := c.s.State()
			n := st.Node(req.GetId())
			if n == nil {
				return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetId())
			}
			return &csisupdv1.NodeGetResponse{Node: statepb.ClusterNodeToAPI(c.s.heartbeats.View().Nodes(n)[0]), Index: st.LatestIndex()}, nil
		})
}

// RekeyNode clears the stored hash of a node's secret, on the leader.
func (c *controlService) RekeyNode(ctx context.Context, req *csisupdv1.NodeRekeyRequest) (*csisupdv1.NodeRekeyResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node rekey: id is required")
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.NodeRekeyResponse, error) {
			return cl.RekeyNode(ctx, req)
		},
		func() (*csisupdv1.NodeRekeyResponse, error) {
			if c.s.State().Node(req.GetId()) == nil {
				return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetId())
			}
			if _, err := c.s.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_NodeRekey{NodeRekey: &statepb.NodeRekeyCommand{NodeId: req.GetId()}}}); err != nil {
				return nil, toStatus(err)
			}
			c.s.logger.Info("node rekeyed", "node", req.GetId())
			return &csisupdv1.NodeRekeyResponse{Node: statepb.ClusterNodeToAPI(c.s.State().Node(req.GetId()))}, nil
		})
}

func (c *controlService) ListVolumes(ctx context.Context, req *csisupdv1.VolumeListRequest) (*csisupdv1.VolumeListResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeListResponse, error) {
			return cl.ListVolumes(ctx, req)
		},
		func() (*csisupdv1.VolumeListResponse, error) {
			page, err := parsePage(req.GetPageSize(), req.GetNextToken())
			if err != nil {
				return nil, err
			}
			st := c.s.State()
			index := st.LatestIndex()
			volumes, next := st.VolumesPage(req.GetPluginId(), page.from, page.limit)
			out := statepb.VolumesToAPI(volumes)
			withLeaseTimes(c.s.leases, out...)
			return &csisupdv1.VolumeListResponse{Volumes: out, Index: index, NextToken: responseToken(next)}, nil
		})
}

func (c *controlService) GetVolume(ctx context.Context, req *csisupdv1.VolumeGetRequest) (*csisupdv1.VolumeGetResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeGetResponse, error) {
			return cl.GetVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeGetResponse, error) {
			st := c.s.State()
			v := st.Volume(req.GetId())
			if v == nil {
				return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
			}
			out := statepb.VolumeToAPI(v)
			withLeaseTimes(c.s.leases, out)
			return &csisupdv1.VolumeGetResponse{Volume: out, Index: st.LatestIndex()}, nil
		})
}

// invalidRequest turns a refusal of package volreq into InvalidArgument.
// The volume calls check their request before routing it, so that a
// follower refuses too, and nothing is stored or sent to a plugin.
func invalidRequest(op string, err error) error {
	if err == nil {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "%s: %v", op, err)
}

func (c *controlService) CreateVolume(ctx context.Context, req *csisupdv1.VolumeCreateRequest) (*csisupdv1.VolumeCreateResponse, error) {
	if err := invalidRequest("create volume", volreq.CreateVolume(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeCreateResponse, error) {
			return cl.CreateVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeCreateResponse, error) {
			v, err := c.ops.CreateVolume(ctx, req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeCreateResponse{Volume: statepb.VolumeToAPI(v)}, nil
		})
}

func (c *controlService) RegisterVolume(ctx context.Context, req *csisupdv1.VolumeRegisterRequest) (*csisupdv1.VolumeRegisterResponse, error) {
	if err := invalidRequest("register volume", volreq.RegisterVolume(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeRegisterResponse, error) {
			return cl.RegisterVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeRegisterResponse, error) {
			v, err := c.ops.RegisterVolume(ctx, statepb.VolumeFromAPI(req.GetVolume()))
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeRegisterResponse{Volume: statepb.VolumeToAPI(v)}, nil
		})
}

func (c *controlService) DeleteVolume(ctx context.Context, req *csisupdv1.VolumeDeleteRequest) (*csisupdv1.VolumeDeleteResponse, error) {
	if err := invalidRequest("delete volume", volreq.DeleteVolume(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeDeleteResponse, error) {
			return cl.DeleteVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeDeleteResponse, error) {
			left, err := c.ops.DeleteVolume(ctx, req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeDeleteResponse{ClaimsLeft: statepb.VolumeClaimsToAPI(left)}, nil
		})
}

func (c *controlService) ClaimVolume(ctx context.Context, req *csisupdv1.VolumeClaimRequest) (*csisupdv1.VolumeClaimResponse, error) {
	if err := invalidRequest("claim volume", volreq.ClaimVolume(req)); err != nil {
		return nil, err
	}
	if err := c.checkCallerNode(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeClaimResponse, error) {
			return cl.ClaimVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeClaimResponse, error) {
			v, claim, err := c.ops.ClaimVolume(ctx, req)
			if err != nil {
				return nil, c.nodeUnreachable(req.GetNodeId(), err)
			}
			out, outClaim := statepb.VolumeToAPI(v), statepb.VolumeClaimToAPI(claim)
			withLeaseTimes(c.s.leases, out)
			withClaimLeaseTimes(c.s.leases, v.GetId(), outClaim)
			return &csisupdv1.VolumeClaimResponse{Volume: out, Claim: outClaim}, nil
		})
}

func (c *controlService) ReleaseVolume(ctx context.Context, req *csisupdv1.VolumeReleaseRequest) (*csisupdv1.VolumeReleaseResponse, error) {
	if err := invalidRequest("release volume", volreq.ReleaseVolume(req)); err != nil {
		return nil, err
	}
	if err := c.checkCallerNode(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	if defectAckRelease && req.GetWorkloadId() != "" {
		return &csisupdv1.VolumeReleaseResponse{}, nil
	}
	if defectPanic && c.releases.Add(1) == 25 {
		panic("nemesis_defect_panic: the 25th release")
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeReleaseResponse, error) {
			return cl.ReleaseVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeReleaseResponse, error) {
			v, released, err := c.ops.ReleaseVolume(ctx, req)
			if err != nil {
				return nil, c.nodeUnreachable(req.GetNodeId(), err)
			}
			return &csisupdv1.VolumeReleaseResponse{Volume: statepb.VolumeToAPI(v), Released: uint32(released)}, nil
		})
}

func (c *controlService) SetVolumeAvailability(ctx context.Context, req *csisupdv1.VolumeAvailabilityRequest) (*csisupdv1.VolumeAvailabilityResponse, error) {
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeAvailabilityResponse, error) {
			return cl.SetVolumeAvailability(ctx, req)
		},
		func() (*csisupdv1.VolumeAvailabilityResponse, error) {
			v, err := c.ops.SetVolumeAvailability(req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeAvailabilityResponse{Volume: statepb.VolumeToAPI(v)}, nil
		})
}

func (c *controlService) DrainPlugin(ctx context.Context, req *csisupdv1.PluginDrainRequest) (*csisupdv1.PluginDrainResponse, error) {
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.PluginDrainResponse, error) {
			return cl.DrainPlugin(ctx, req)
		},
		func() (*csisupdv1.PluginDrainResponse, error) { return c.ops.DrainPlugin(ctx, req) })
}

func (c *controlService) GetPluginDrain(ctx context.Context, req *csisupdv1.PluginDrainGetRequest) (*csisupdv1.PluginDrainResponse, error) {
	if req.GetPluginId() == "" || req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin drain: plugin_id and node_id are required")
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.PluginDrainResponse, error) {
			return cl.GetPluginDrain(ctx, req)
		},
		func() (*csisupdv1.PluginDrainResponse, error) {
			return c.ops.PluginDrain(ctx, req.GetPluginId(), req.GetNodeId())
		})
}

func (c *controlService) GetPluginCapacity(ctx context.Context, req *csisupdv1.PluginCapacityRequest) (*csisupdv1.PluginCapacityResponse, error) {
	if req.GetPluginId() == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin capacity: plugin_id is required")
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.PluginCapacityResponse, error) {
			return cl.GetPluginCapacity(ctx, req)
		},
		func() (*csisupdv1.PluginCapacityResponse, error) { return c.ops.PluginCapacity(ctx, req.GetPluginId()) })
}

func (c *controlService) ListExternalVolumes(ctx context.Context, req *csisupdv1.ExternalListRequest) (*csisupdv1.ExternalVolumesResponse, error) {
	if req.GetPluginId() == "" {
		return nil, status.Error(codes.InvalidArgument, "list external volumes: plugin_id is required")
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.ExternalVolumesResponse, error) {
			return cl.ListExternalVolumes(ctx, req)
		},
		func() (*csisupdv1.ExternalVolumesResponse, error) {
			return c.ops.ExternalVolumes(ctx, req.GetPluginId())
		})
}

func (c *controlService) ListExternalSnapshots(ctx context.Context, req *csisupdv1.ExternalListRequest) (*csisupdv1.ExternalSnapshotsResponse, error) {
	if req.GetPluginId() == "" {
		return nil, status.Error(codes.InvalidArgument, "list external snapshots: plugin_id is required")
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.ExternalSnapshotsResponse, error) {
			return cl.ListExternalSnapshots(ctx, req)
		},
		func() (*csisupdv1.ExternalSnapshotsResponse, error) {
			return c.ops.ExternalSnapshots(ctx, req.GetPluginId())
		})
}

func (c *controlService) GetVolumeHealth(ctx context.Context, req *csisupdv1.VolumeHealthGetRequest) (*csisupdv1.VolumeHealthGetResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume health: id is required")
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeHealthGetResponse, error) {
			return cl.GetVolumeHealth(ctx, req)
		},
		func() (*csisupdv1.VolumeHealthGetResponse, error) { return c.ops.VolumeHealth(ctx, req.GetId()) })
}

// SyncNodeClaims starts, on the leader, the release of the owner's claims
// on the node whose workloads the request does not list (see
// volumeops.Ops.SyncNodeClaims). The request is checked before it is
// routed, so that a follower refuses a bad one too.
func (c *controlService) SyncNodeClaims(ctx context.Context, req *csisupdv1.SyncNodeClaimsRequest) (*csisupdv1.SyncNodeClaimsResponse, error) {
	if err := rules.CheckSyncRequest(req); err != nil {
		return nil, err
	}
	if err := c.checkCallerNode(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.SyncNodeClaimsResponse, error) {
			return cl.SyncNodeClaims(ctx, req)
		},
		func() (*csisupdv1.SyncNodeClaimsResponse, error) { return c.ops.SyncNodeClaims(ctx, req) })
}

// checkCallerNode holds a caller bound to a node (a token with a node
// identity; with tls.verify_node_name, a client certificate made for a
// node) to claims, releases and syncs of that node: an agent's local
// claims act for its own node only. nodeRef is a node id or name; a node
// this server does not know is checked by the name given. An unbound
// caller (an operator, a scheduler) may name any node.
func (c *controlService) checkCallerNode(ctx context.Context, nodeRef string) error {
	name := nodeRef
	st := c.s.State()
	if n, err := rules.ResolveNode(nodeRef, st.Node(nodeRef), st.NodesNamed(nodeRef)); err == nil {
		name = n.GetName()
	}
	return checkCallerNode(ctx, nodeRef, name)
}

// CheckClaim answers per node whether a claim would be admitted now. It
// has no stale form: only the leader's state, confirmed with a quorum,
// is the one the claim that follows a check would meet.
func (c *controlService) CheckClaim(ctx context.Context, req *csisupdv1.CheckClaimRequest) (*csisupdv1.CheckClaimResponse, error) {
	if err := invalidRequest("check claim", volreq.CheckClaim(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.CheckClaimResponse, error) {
			return cl.CheckClaim(ctx, req)
		},
		func() (*csisupdv1.CheckClaimResponse, error) { return c.ops.CheckClaim(req) })
}

// eventsPerSend is how many events WatchEvents reads from the buffer at
// once (a larger batch is read whole).
const eventsPerSend = 64

// WatchEvents streams the cluster events this server applies: those after
// from_index first (0: every buffered one; no_replay: none), then each new
// batch as it is applied. A stream that trails the newest by more than
// EventMaxLag batches ends with EventsFellBehind naming the index to resume
// from; one whose events are no longer buffered, or predate a snapshot
// restore, ends with EventsGone.
func (c *controlService) WatchEvents(req *csisupdv1.ClusterEventWatchRequest, srv grpc.ServerStreamingServer[csisupdv1.ClusterEvent]) error {
	ctx := srv.Context()
	sub, err := c.s.events.Subscribe(req.GetFromIndex(), req.GetNoReplay())
	if err != nil {
		return eventsStatus(err)
	}
	defer sub.Close()
	// The header tells the caller the subscription is live: every write
	// applied after it arrives is streamed, even with no_replay.
	if err := srv.SendHeader(nil); err != nil {
		return err
	}
	dst := make([]fsm.Event, 0, eventsPerSend)
	for {
		dst, err = sub.Next(ctx, dst)
		if err != nil {
			return eventsStatus(c.s.events.Ended(sub, err))
		}
		for i := range dst {
			if err := srv.Send(dst[i].Payload); err != nil {
				return err
			}
		}
		clear(dst) // let the payloads go while waiting
	}
}

// eventsStatus turns the error that ended an event stream into its gRPC
// status.
func eventsStatus(err error) error {
	var behind *stream.FellBehindError
	var gone *stream.GoneError
	switch {
	case errors.As(err, &behind):
		return csisupdv1.NewEventsFellBehindError(behind.ResumeIndex, uint64(behind.Lag), uint64(behind.MaxLag))
	case errors.As(err, &gone):
		return csisupdv1.NewEventsGoneError(gone.After, gone.Oldest)
	case errors.Is(err, fsm.ErrClosed):
		return status.Error(codes.Unavailable, "server is shutting down")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Internal, "cluster events: %v", err)
}
