//go:build nemesis

package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds of the workload's calls.
const (
	callTimeout = 20 * time.Second // one Control call; longer than a slowed plugin's answer
	volumeBytes = 1 << 20
)

// Access modes by kind, as the Control API names them: every mode the
// test plugin serves (it lacks the SINGLE_NODE_MULTI_WRITER capability,
// so not SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER).
var (
	sharedModes = []string{"SINGLE_NODE_WRITER", "SINGLE_NODE_READER_ONLY",
		"MULTI_NODE_READER_ONLY", "MULTI_NODE_SINGLE_WRITER", "MULTI_NODE_MULTI_WRITER"}
	// A node-local volume offers only the single-node modes.
	localModes = []string{"SINGLE_NODE_WRITER", "SINGLE_NODE_READER_ONLY"}
)

// readerOnly reports whether mode allows read-only claims only.
func readerOnly(mode string) bool {
	return mode == "MULTI_NODE_READER_ONLY" || mode == "SINGLE_NODE_READER_ONLY"
}

// baseVolume is one of the volumes the schedulers claim.
type baseVolume struct {
	id, plugin string
	modes      []string
	home       string // the node a node-local volume lives on
}

// Workload runs the test's clients against the cluster: schedulers that
// claim and release, a lifecycle client that creates, deletes, snapshots
// and expands, and bursts of concurrent claims on one volume. Every claim,
// release and read is kept in the history for the model check.
type Workload struct {
	c       *Cluster
	seed    int64
	volumes []baseVolume
	nodeIDs map[string]string // agent host name -> csisupd node id

	mu      sync.Mutex
	history []Op
	counts  map[string]int            // by "kind outcome"
	held    map[int]map[string]string // per client: claim key -> volume, outcome not yet a known release
	clients int
}

// newWorkload makes the base volumes: for each plugin, volumes with every
// access mode it allows; node-local ones on their home nodes by topology.
func newWorkload(ctx context.Context, c *Cluster, seed int64) (*Workload, error) {
	w := &Workload{c: c, seed: seed, counts: map[string]int{}, held: map[int]map[string]string{}, nodeIDs: map[string]string{}}
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	// The Control API names nodes by id; the history and the journals
	// by the plugin's node id, the agent's host name.
	err := c.waitFor(formTimeout, "every agent's node id", func() (bool, error) {
		_, err := w.call(ctx, rng, func(ctx context.Context, cl csisupdv1.ControlClient) error {
			resp, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{})
			for _, n := range resp.GetNodes() {
				w.nodeIDs[n.GetName()] = n.GetId()
			}
			return err
		})
		for _, a := range c.Agents() {
			if w.nodeIDs[a] == "" {
				return false, err
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	for i := 1; i <= 4; i++ {
		w.volumes = append(w.volumes, baseVolume{id: fmt.Sprintf("shared-%d", i), plugin: sharedPlugin, modes: sharedModes})
	}
	for i, a := range c.Agents() {
		if i >= 3 {
			break
		}
		w.volumes = append(w.volumes, baseVolume{id: fmt.Sprintf("local-%s", a), plugin: localPlugin, modes: localModes, home: a})
	}
	for _, v := range w.volumes {
		req := &csisupdv1.VolumeCreateRequest{Id: v.id, PluginId: v.plugin, CapacityMinBytes: volumeBytes}
		for _, m := range v.modes {
			req.Capabilities = append(req.Capabilities, &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: m})
		}
		if v.home != "" {
			req.AccessibilityRequirements = &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{
				{Segments: map[string]string{testplugin.DefaultTopologyKey: v.home}}}}
		}
		err := c.waitFor(formTimeout, "volume "+v.id+" created", func() (bool, error) {
			_, err := w.call(ctx, rng, func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.CreateVolume(ctx, req)
				return err
			})
			return err == nil || status.Code(err) == codes.AlreadyExists, err
		})
		if err != nil {
			return nil, err
		}
	}
	return w, nil
}

// call runs f against a random server's Control API within callTimeout.
func (w *Workload) call(ctx context.Context, rng *rand.Rand, f func(context.Context, csisupdv1.ControlClient) error) (string, error) {
	servers := w.c.Servers()
	s := servers[rng.IntN(len(servers))]
	cl, err := w.c.Control(s)
	if err != nil {
		return s, err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return s, f(cctx, cl)
}

// outcome classifies a claim's or release's error.
func outcome(err error) string {
	if err == nil {
		return outOK
	}
	st, ok := status.FromError(err)
	if !ok {
		return outUnknown
	}
	for _, d := range st.Details() {
		if _, ok := d.(*csisupdv1.ClaimRefused); ok {
			return outRefused
		}
	}
	if st.Code() == codes.InvalidArgument {
		return outRefused // nothing was done; counted apart to show
	}
	return outUnknown
}

// newClient returns a new client id.
func (w *Workload) newClient() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.clients++
	w.held[w.clients] = map[string]string{}
	return w.clients
}

func (w *Workload) record(o Op) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.history = append(w.history, o)
	k := o.Kind
	if o.Kind != opGet {
		k += " " + o.Outcome
	}
	w.counts[k]++
	held := w.held[o.Client]
	switch {
	case o.Kind == opClaim && o.Outcome != outRefused:
		held[o.key()] = o.Volume
	case o.Kind == opRelease && o.Outcome == outOK:
		delete(held, o.key())
	}
}

// count adds one to a lifecycle counter.
func (w *Workload) count(k string) { w.countN(k, 1) }

// countN adds n to a counter.
func (w *Workload) countN(k string, n int) {
	w.mu.Lock()
	w.counts[k] += n
	w.mu.Unlock()
}

// History returns the claim history so far.
func (w *Workload) History() []Op {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.history)
}

// Counts returns the operation counters.
func (w *Workload) Counts() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.counts {
		out[k] = v
	}
	return out
}

// claim claims v on node for workload.
func (w *Workload) claim(ctx context.Context, rng *rand.Rand, client int, v baseVolume, node, workload, mode string, readOnly bool) Op {
	o := Op{Client: client, Kind: opClaim, Volume: v.id, Node: node, Workload: workload}
	return w.do(ctx, rng, o, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		_, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: v.id, NodeId: w.nodeIDs[node], WorkloadId: workload,
			Usage: &csisupdv1.VolumeUsage{AccessMode: mode, AccessType: "mount", ReadOnly: readOnly}})
		return err
	})
}

// release releases workload's claim of volume on node.
func (w *Workload) release(ctx context.Context, rng *rand.Rand, client int, volume, node, workload string) Op {
	o := Op{Client: client, Kind: opRelease, Volume: volume, Node: node, Workload: workload}
	return w.do(ctx, rng, o, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		_, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: volume, NodeId: w.nodeIDs[node], WorkloadId: workload})
		return err
	})
}

// do makes the call of claim or release o, times it, records its
// outcome in the history and returns it.
func (w *Workload) do(ctx context.Context, rng *rand.Rand, o Op, f func(context.Context, csisupdv1.ControlClient) error) Op {
	o.Call = time.Now()
	_, err := w.call(ctx, rng, f)
	o.Return, o.Outcome = time.Now(), outcome(err)
	if err != nil {
		o.Err = err.Error()
	}
	w.record(o)
	return o
}

// get reads volume's claims; a failed read is not in the history.
func (w *Workload) get(ctx context.Context, rng *rand.Rand, client int, volume string) {
	o := Op{Client: client, Kind: opGet, Volume: volume, Call: time.Now()}
	var v *csisupdv1.Volume
	_, err := w.call(ctx, rng, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: volume})
		v = resp.GetVolume()
		return err
	})
	o.Return = time.Now()
	if err != nil {
		w.count("get failed")
		return
	}
	for _, c := range v.GetClaims() {
		o.Held = append(o.Held, c.GetCsiNodeId()+"/"+c.GetWorkloadId())
	}
	w.record(o)
}

// Scheduler claims and releases random volumes for random workloads on
// random nodes until ctx ends, as one client: one call at a time.
func (w *Workload) Scheduler(ctx context.Context, n int) {
	client := w.newClient()
	rng := rand.New(rand.NewPCG(uint64(w.seed), uint64(100+n)))
	agents := w.c.Agents()
	next := 0
	for ctx.Err() == nil {
		w.mu.Lock()
		var mine []string
		for k := range w.held[client] {
			mine = append(mine, k)
		}
		w.mu.Unlock()
		slices.Sort(mine)
		r := rng.Float64()
		switch {
		case r < 0.40 && len(mine) > 0 || len(mine) > 6:
			k := mine[rng.IntN(len(mine))]
			w.mu.Lock()
			volume := w.held[client][k]
			w.mu.Unlock()
			node, workload := splitKey(k)
			w.release(ctx, rng, client, volume, node, workload)
		case r < 0.85:
			v := w.volumes[rng.IntN(len(w.volumes))]
			node := agents[rng.IntN(len(agents))]
			if v.home != "" && rng.Float64() < 0.8 {
				node = v.home
			}
			mode := v.modes[rng.IntN(len(v.modes))]
			next++
			w.claim(ctx, rng, client, v, node, fmt.Sprintf("w%d-%d", client, next), mode, readerOnly(mode) || rng.Float64() < 0.25)
		default:
			w.get(ctx, rng, client, w.volumes[rng.IntN(len(w.volumes))].id)
		}
		// A scheduler places a workload every few tens of milliseconds,
		// not in a loop as fast as failures come back.
		pause(ctx, time.Duration(20+rng.IntN(80))*time.Millisecond)
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func splitKey(k string) (node, workload string) {
	for i := range len(k) {
		if k[i] == '/' {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

// Burst makes n concurrent read-write claims of one shared single-writer
// volume from different nodes, each its own client, and returns when all
// have answered; the caller kills or stops the leader meanwhile. The
// claims that may hold are released by the schedulers' drain at the end.
func (w *Workload) Burst(ctx context.Context, rng *rand.Rand, n int) {
	v := w.volumes[rng.IntN(4)] // a shared volume
	mode := []string{"SINGLE_NODE_WRITER", "MULTI_NODE_SINGLE_WRITER"}[rng.IntN(2)]
	agents := w.c.Agents()
	var wg sync.WaitGroup
	for i := range n {
		client := w.newClient()
		node := agents[i%len(agents)]
		crng := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.claim(ctx, crng, client, v, node, fmt.Sprintf("burst%d", client), mode, false)
		}()
	}
	wg.Wait()
}

// Lifecycle creates, deletes, snapshots and expands volumes of its own
// until ctx ends (and expands the base volumes, which schedulers hold, so
// that node expansion runs on mounted volumes).
func (w *Workload) Lifecycle(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(w.seed), 7))
	agents := w.c.Agents()
	var mine, snaps []string
	n := 0
	do := func(what string, f func(context.Context, csisupdv1.ControlClient) error) bool {
		_, err := w.call(ctx, rng, f)
		out := "ok"
		if err != nil {
			out = "failed"
		}
		w.count(what + " " + out)
		return err == nil
	}
	for ctx.Err() == nil {
		// Every case but the first needs a volume of its own.
		switch r := rng.Float64(); {
		case r < 0.3 || len(mine) == 0:
			n++
			id := fmt.Sprintf("tmp-%d", n)
			req := &csisupdv1.VolumeCreateRequest{Id: id, PluginId: sharedPlugin, CapacityMinBytes: volumeBytes}
			if rng.IntN(2) == 0 {
				req.PluginId = localPlugin
				req.AccessibilityRequirements = &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{
					{Segments: map[string]string{testplugin.DefaultTopologyKey: agents[rng.IntN(len(agents))]}}}}
			}
			if do("create", func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.CreateVolume(ctx, req)
				return err
			}) {
				mine = append(mine, id)
			}
		case r < 0.5:
			i := rng.IntN(len(mine))
			id := mine[i]
			if do("delete", func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: id})
				return gone(err)
			}) {
				mine = slices.Delete(mine, i, i+1)
			}
		case r < 0.7:
			src := mine[rng.IntN(len(mine))]
			n++
			id := fmt.Sprintf("snap-%d", n)
			if do("snapshot", func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: src, Id: id})
				return err
			}) {
				snaps = append(snaps, id)
			}
		case r < 0.8 && len(snaps) > 0:
			i := rng.IntN(len(snaps))
			id := snaps[i]
			if do("snapshot-delete", func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: id})
				return gone(err)
			}) {
				snaps = slices.Delete(snaps, i, i+1)
			}
		default:
			id := mine[rng.IntN(len(mine))]
			if rng.IntN(2) == 0 {
				id = w.volumes[rng.IntN(len(w.volumes))].id
			}
			do("expand", func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: id})
				if err != nil {
					return err
				}
				_, err = cl.ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: id,
					CapacityMinBytes: resp.GetVolume().GetCapacityBytes() + volumeBytes})
				return err
			})
		}
		// Lifecycle calls are load beside the claims, not the point: one
		// every few hundred milliseconds.
		pause(ctx, time.Duration(200+rng.IntN(400))*time.Millisecond)
	}
}

// gone takes NotFound for done: a delete wants its object absent.
func gone(err error) error {
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}

// Drain releases every claim the servers hold, retrying until each
// release is acknowledged or the deadline passes, and records each in the
// history (as client 0's, a client of its own).
func (w *Workload) Drain(ctx context.Context, client int) error {
	rng := rand.New(rand.NewPCG(uint64(w.seed), 9))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last error
	for {
		claims, err := w.c.Claims(ctx)
		if err == nil && len(claims) == 0 {
			return nil
		}
		last = err
		for _, cl := range claims {
			if o := w.release(ctx, rng, client, cl.Volume, cl.Node, cl.Workload); o.Outcome != outOK {
				last = errors.New(o.Err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nemesis: claims still held when the drain's deadline passed (last error: %v)", last)
		case <-tick.C:
		}
	}
}
