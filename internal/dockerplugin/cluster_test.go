package dockerplugin_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// fakeCluster stands in for the servers as nodeclient.LocalClaims answers
// them for one node (Control's volume calls, bound to this node):
//
//   - GetVolume, DeleteVolume and Claim of an unknown volume are gRPC
//     NotFound statuses;
//   - CreateVolume of an existing id returns the volume when the plugin is
//     the same and is AlreadyExists when it is not (Control.CreateVolume);
//   - Claim of a workload that holds a claim of the volume on this node
//     returns that claim again (idempotent); each workload's claim has a
//     host path of its own;
//   - DeleteVolume of a volume with claims is FailedPrecondition;
//   - Release of a claim that is not there succeeds;
//   - ClaimsIndex is the cluster's index, which every write raises, and a
//     claim records the index it was taken at (claim_index);
//   - Sync releases the claims of owner on this node whose workload is
//     not listed and whose claim_index is at most knownIndex.
//
// Each method may be made to fail (failWith), Claim to wait (hold), and
// every call is logged in order (calls), with the calls of the fake
// engine.
type fakeCluster struct {
	node string

	mu      sync.Mutex
	index   uint64
	volumes map[string]*csisupdv1.Volume
	creates []*csisupdv1.VolumeCreateRequest
	syncs   []syncCall
	log     []string
	fail    map[string]error
	// gates hold calls of a method until released (gate).
	gates map[string]*gate
}

// gate holds the calls of a method: each sends on entered, then waits
// for release to be closed or its context to end.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

// syncCall is the arguments of one Sync.
type syncCall struct {
	owner      string
	workloads  []string
	knownIndex uint64
}

func newFakeCluster(node string) *fakeCluster {
	return &fakeCluster{node: node, volumes: map[string]*csisupdv1.Volume{}, fail: map[string]error{}, gates: map[string]*gate{}}
}

// record logs a call and returns the error it is made to fail with. The
// caller holds mu.
func (c *fakeCluster) record(method string) error {
	c.log = append(c.log, method)
	return c.fail[method]
}

// note logs a call of something else (the fake engine).
func (c *fakeCluster) note(what string) {
	c.mu.Lock()
	c.log = append(c.log, what)
	c.mu.Unlock()
}

// hold makes the calls of method wait at a gate, which it returns.
func (c *fakeCluster) hold(method string) *gate {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := &gate{entered: make(chan struct{}, 16), release: make(chan struct{})}
	c.gates[method] = g
	return g
}

// pass waits at method's gate, if it has one.
func (c *fakeCluster) pass(ctx context.Context, method string) error {
	c.mu.Lock()
	g := c.gates[method]
	c.mu.Unlock()
	if g == nil {
		return nil
	}
	g.entered <- struct{}{}
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// failWith makes method fail with err (nil: succeed again).
func (c *fakeCluster) failWith(method string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		delete(c.fail, method)
		return
	}
	c.fail[method] = err
}

// calls returns the log of calls.
func (c *fakeCluster) calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.log)
}

// created returns the CreateVolume requests.
func (c *fakeCluster) created() []*csisupdv1.VolumeCreateRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.creates)
}

// synced returns the Sync calls.
func (c *fakeCluster) synced() []syncCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.syncs)
}

// addVolume stores a volume as another client created it.
func (c *fakeCluster) addVolume(v *csisupdv1.Volume) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	v = proto.Clone(v).(*csisupdv1.Volume)
	v.CreateIndex, v.ModifyIndex = c.index, c.index
	c.volumes[v.GetId()] = v
}

// addClaim stores a taken claim of volume on node for workload, as
// another client made it.
func (c *fakeCluster) addClaim(volume, node, workload, owner string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	v := c.volumes[volume]
	v.Claims = append(v.Claims, c.claim(volume, node, workload, owner))
}

// claim returns a taken claim at the current index. The caller holds mu.
func (c *fakeCluster) claim(volume, node, workload, owner string) *csisupdv1.VolumeClaim {
	return &csisupdv1.VolumeClaim{
		NodeId: node, WorkloadId: workload, Owner: owner, State: "taken", ClaimIndex: c.index,
		HostPath:  fmt.Sprintf("/var/lib/csisupd/volumes/%s/%s", volume, workload),
		ClaimedAt: timestamppb.Now(), Mounted: true,
	}
}

// workloads returns the workloads of volume's claims, sorted; nil when
// the volume does not exist.
func (c *fakeCluster) workloads(volume string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.volumes[volume]
	if !ok {
		return nil
	}
	out := []string{}
	for _, cl := range v.GetClaims() {
		out = append(out, cl.GetWorkloadId())
	}
	slices.Sort(out)
	return out
}

func (c *fakeCluster) NodeID() string { return c.node }

func (c *fakeCluster) CreateVolume(_ context.Context, req *csisupdv1.VolumeCreateRequest) (*csisupdv1.Volume, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("CreateVolume"); err != nil {
		return nil, err
	}
	c.creates = append(c.creates, proto.Clone(req).(*csisupdv1.VolumeCreateRequest))
	if v, ok := c.volumes[req.GetId()]; ok {
		if v.GetPluginId() != req.GetPluginId() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists for plugin %q", req.GetId(), v.GetPluginId())
		}
		return proto.Clone(v).(*csisupdv1.Volume), nil
	}
	c.index++
	v := &csisupdv1.Volume{
		Id: req.GetId(), PluginId: req.GetPluginId(), ExternalId: "ext-" + req.GetId(),
		CapacityBytes: req.GetCapacityMinBytes(), Capabilities: req.GetCapabilities(), Parameters: req.GetParameters(),
		CreatedAt: timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)), CreateIndex: c.index, ModifyIndex: c.index,
	}
	c.volumes[v.GetId()] = v
	return proto.Clone(v).(*csisupdv1.Volume), nil
}

func (c *fakeCluster) GetVolume(_ context.Context, id string) (*csisupdv1.Volume, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("GetVolume"); err != nil {
		return nil, err
	}
	v, ok := c.volumes[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	return proto.Clone(v).(*csisupdv1.Volume), nil
}

func (c *fakeCluster) ListVolumes(context.Context) ([]*csisupdv1.Volume, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("ListVolumes"); err != nil {
		return nil, err
	}
	var out []*csisupdv1.Volume
	for _, id := range slices.Sorted(maps.Keys(c.volumes)) {
		out = append(out, proto.Clone(c.volumes[id]).(*csisupdv1.Volume))
	}
	return out, nil
}

func (c *fakeCluster) DeleteVolume(_ context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("DeleteVolume"); err != nil {
		return err
	}
	v, ok := c.volumes[id]
	switch {
	case !ok:
		return status.Errorf(codes.NotFound, "volume %q not found", id)
	case len(v.GetClaims()) > 0:
		return status.Errorf(codes.FailedPrecondition, "volume %q has %d claims; release them first", id, len(v.GetClaims()))
	}
	c.index++
	delete(c.volumes, id)
	return nil
}

func (c *fakeCluster) Claim(ctx context.Context, volumeID, workloadID, owner string, lease time.Duration, _ *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error) {
	if err := c.pass(ctx, "Claim"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("Claim"); err != nil {
		return nil, err
	}
	v, ok := c.volumes[volumeID]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", volumeID)
	}
	for _, cl := range v.GetClaims() {
		if cl.GetNodeId() == c.node && cl.GetWorkloadId() == workloadID {
			return &csisupdv1.VolumeClaimResponse{Volume: proto.Clone(v).(*csisupdv1.Volume), Claim: proto.Clone(cl).(*csisupdv1.VolumeClaim)}, nil
		}
	}
	c.index++
	cl := c.claim(volumeID, c.node, workloadID, owner)
	cl.LeaseTtl = durationpb.New(lease)
	v.Claims = append(v.Claims, cl)
	v.ModifyIndex = c.index
	return &csisupdv1.VolumeClaimResponse{Volume: proto.Clone(v).(*csisupdv1.Volume), Claim: proto.Clone(cl).(*csisupdv1.VolumeClaim)}, nil
}

func (c *fakeCluster) Release(_ context.Context, volumeID, workloadID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("Release"); err != nil {
		return err
	}
	v, ok := c.volumes[volumeID]
	if !ok {
		return status.Errorf(codes.NotFound, "volume %q not found", volumeID)
	}
	c.release(v, func(cl *csisupdv1.VolumeClaim) bool {
		return cl.GetNodeId() == c.node && cl.GetWorkloadId() == workloadID
	})
	return nil
}

// release removes the claims of v that match, raising the index once.
// The caller holds mu.
func (c *fakeCluster) release(v *csisupdv1.Volume, match func(*csisupdv1.VolumeClaim) bool) []*csisupdv1.VolumeClaim {
	var gone []*csisupdv1.VolumeClaim
	v.Claims = slices.DeleteFunc(v.Claims, func(cl *csisupdv1.VolumeClaim) bool {
		if match(cl) {
			gone = append(gone, cl)
			return true
		}
		return false
	})
	if len(gone) > 0 {
		c.index++
		v.ModifyIndex = c.index
	}
	return gone
}

func (c *fakeCluster) ClaimsIndex(context.Context) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("ClaimsIndex"); err != nil {
		return 0, err
	}
	return c.index, nil
}

func (c *fakeCluster) Sync(_ context.Context, owner string, workloads []string, knownIndex uint64) (*csisupdv1.SyncNodeClaimsResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.record("Sync"); err != nil {
		return nil, err
	}
	c.syncs = append(c.syncs, syncCall{owner: owner, workloads: slices.Clone(workloads), knownIndex: knownIndex})
	resp := &csisupdv1.SyncNodeClaimsResponse{}
	for _, id := range slices.Sorted(maps.Keys(c.volumes)) {
		v := c.volumes[id]
		gone := c.release(v, func(cl *csisupdv1.VolumeClaim) bool {
			if cl.GetNodeId() != c.node || cl.GetOwner() != owner || slices.Contains(workloads, cl.GetWorkloadId()) {
				return false
			}
			if cl.GetClaimIndex() > knownIndex {
				resp.KeptByIndex = append(resp.KeptByIndex, ref(v, cl))
				return false
			}
			return true
		})
		for _, cl := range gone {
			resp.Released = append(resp.Released, ref(v, cl))
		}
	}
	slices.SortFunc(resp.Released, func(a, b *csisupdv1.ClaimRef) int {
		return cmp.Or(cmp.Compare(a.GetVolumeId(), b.GetVolumeId()), cmp.Compare(a.GetWorkloadId(), b.GetWorkloadId()))
	})
	return resp, nil
}

func ref(v *csisupdv1.Volume, cl *csisupdv1.VolumeClaim) *csisupdv1.ClaimRef {
	return &csisupdv1.ClaimRef{VolumeId: v.GetId(), NodeId: cl.GetNodeId(), WorkloadId: cl.GetWorkloadId(), ClaimIndex: cl.GetClaimIndex()}
}
