package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/volreq"
)

// The Control methods of a volume's life after its creation: expansion,
// modification and snapshots. Writes run on the leader; reads follow
// ListVolumes and GetVolume.

func (c *controlService) ExpandVolume(ctx context.Context, req *csisupdv1.VolumeExpandRequest) (*csisupdv1.VolumeExpandResponse, error) {
	if err := invalidRequest("expand volume", volreq.ExpandClusterVolume(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeExpandResponse, error) {
			return cl.ExpandVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeExpandResponse, error) {
			v, err := c.ops.ExpandVolume(ctx, req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeExpandResponse{Volume: statepb.VolumeToAPI(v)}, nil
		})
}

func (c *controlService) ModifyVolume(ctx context.Context, req *csisupdv1.VolumeModifyRequest) (*csisupdv1.VolumeModifyResponse, error) {
	if err := invalidRequest("modify volume", volreq.ModifyVolume(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeModifyResponse, error) {
			return cl.ModifyVolume(ctx, req)
		},
		func() (*csisupdv1.VolumeModifyResponse, error) {
			v, err := c.ops.ModifyVolume(ctx, req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeModifyResponse{Volume: statepb.VolumeToAPI(v)}, nil
		})
}

func (c *controlService) CreateVolumeSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*csisupdv1.VolumeSnapshotCreateResponse, error) {
	if err := invalidRequest("create snapshot", volreq.CreateSnapshot(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeSnapshotCreateResponse, error) {
			return cl.CreateVolumeSnapshot(ctx, req)
		},
		func() (*csisupdv1.VolumeSnapshotCreateResponse, error) {
			snap, err := c.ops.CreateSnapshot(ctx, req)
			if err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeSnapshotCreateResponse{Snapshot: statepb.VolumeSnapshotView(snap)}, nil
		})
}

func (c *controlService) DeleteVolumeSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotDeleteRequest) (*csisupdv1.VolumeSnapshotDeleteResponse, error) {
	if err := invalidRequest("delete snapshot", volreq.DeleteSnapshot(req)); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeSnapshotDeleteResponse, error) {
			return cl.DeleteVolumeSnapshot(ctx, req)
		},
		func() (*csisupdv1.VolumeSnapshotDeleteResponse, error) {
			if err := c.ops.DeleteSnapshot(ctx, req); err != nil {
				return nil, err
			}
			return &csisupdv1.VolumeSnapshotDeleteResponse{}, nil
		})
}

func (c *controlService) ListVolumeSnapshots(ctx context.Context, req *csisupdv1.VolumeSnapshotListRequest) (*csisupdv1.VolumeSnapshotListResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeSnapshotListResponse, error) {
			return cl.ListVolumeSnapshots(ctx, req)
		},
		func() (*csisupdv1.VolumeSnapshotListResponse, error) {
			page, err := parsePage(req.GetPageSize(), req.GetNextToken())
			if err != nil {
				return nil, err
			}
			st := c.s.State()
			index := st.LatestIndex()
			var keep func(*statepb.VolumeSnapshot) bool
			if req.GetVolumeId() != "" || req.GetPluginId() != "" {
				keep = func(s *statepb.VolumeSnapshot) bool {
					return (req.GetVolumeId() == "" || s.GetSourceVolumeId() == req.GetVolumeId()) &&
						(req.GetPluginId() == "" || s.GetPluginId() == req.GetPluginId())
				}
			}
			snaps, next := st.VolumeSnapshotsPage(page.from, page.limit, keep)
			out := &csisupdv1.VolumeSnapshotListResponse{Index: index, NextToken: responseToken(next)}
			for _, s := range snaps {
				out.Snapshots = append(out.Snapshots, statepb.VolumeSnapshotView(s))
			}
			return out, nil
		})
}

func (c *controlService) GetVolumeSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotGetRequest) (*csisupdv1.VolumeSnapshotGetResponse, error) {
	return route(ctx, c.s.fwd, req.GetStale(), true,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeSnapshotGetResponse, error) {
			return cl.GetVolumeSnapshot(ctx, req)
		},
		func() (*csisupdv1.VolumeSnapshotGetResponse, error) {
			st := c.s.State()
			snap := st.VolumeSnapshot(req.GetId())
			if snap == nil {
				return nil, status.Errorf(codes.NotFound, "snapshot %q not found", req.GetId())
			}
			return &csisupdv1.VolumeSnapshotGetResponse{Snapshot: statepb.VolumeSnapshotView(snap), Index: st.LatestIndex()}, nil
		})
}
