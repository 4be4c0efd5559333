package nodeclient_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/testutil"
)

// leaseClaim is a leased claim the leaseServer holds for a workload.
type leaseClaim struct {
	volumeID string
	ttl      time.Duration
}

// renewCall is one NodeRenewClaims a leaseServer answered.
type renewCall struct {
	at        time.Time
	nodeID    string
	secret    string
	workloads []string
}

// leaseServer is a gRPC Cluster server that answers as the leader does
// after issue 41: NodeRegister and NodeHeartbeat accept the node with a
// heartbeat TTL; NodeRenewClaims (Control.RenewClaims for the caller's
// node) renews, for each requested workload, every leased claim it holds
// on the node, listing each with its volume, workload, lease_ttl and new
// deadline (now + lease_ttl), and lists in lost_workload_ids each
// requested workload that holds no claim on the node; a workload whose
// claims carry no lease is in neither list. It records every renewal.
// The leader's renewals write nothing, so neither does this server.
type leaseServer struct {
	csisupdv1.UnimplementedClusterServer
	addr string
	srv  *grpc.Server

	mu     sync.Mutex
	claims map[string][]leaseClaim // workload -> leased claims on the node
	calls  []renewCall
}

// newLeaseServer serves a leaseServer on a loopback port until the test
// ends or stop.
func newLeaseServer(t *testing.T, claims map[string][]leaseClaim) *leaseServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &leaseServer{addr: l.Addr().String(), srv: grpc.NewServer(), claims: claims}
	csisupdv1.RegisterClusterServer(s.srv, s)
	testutil.ServeGRPC(t, l, s.srv)
	return s
}

func (s *leaseServer) NodeRegister(context.Context, *csisupdv1.NodeRegisterRequest) (*csisupdv1.NodeRegisterResponse, error) {
	return &csisupdv1.NodeRegisterResponse{HeartbeatTtlMs: 10_000, Index: 1}, nil
}

func (s *leaseServer) NodeHeartbeat(context.Context, *csisupdv1.NodeHeartbeatRequest) (*csisupdv1.NodeHeartbeatResponse, error) {
	return &csisupdv1.NodeHeartbeatResponse{HeartbeatTtlMs: 10_000}, nil
}

func (s *leaseServer) NodeRenewClaims(ctx context.Context, req *csisupdv1.RenewClaimsRequest) (*csisupdv1.RenewClaimsResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var secret string
	if v := md.Get(csisupdv1.NodeSecretMetadataKey); len(v) == 1 {
		secret = v[0]
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, renewCall{at: now, nodeID: req.GetNodeId(), secret: secret, workloads: slices.Clone(req.GetWorkloadIds())})
	resp := &csisupdv1.RenewClaimsResponse{}
	for _, w := range req.GetWorkloadIds() {
		claims, ok := s.claims[w]
		if !ok {
			resp.LostWorkloadIds = append(resp.LostWorkloadIds, w)
			continue
		}
		for _, c := range claims {
			resp.Renewed = append(resp.Renewed, &csisupdv1.RenewedClaim{
				VolumeId: c.volumeID, WorkloadId: w,
				LeaseTtl: durationpb.New(c.ttl), Deadline: timestamppb.New(now.Add(c.ttl)),
			})
		}
	}
	return resp, nil
}

// renewals returns the renewals answered so far.
func (s *leaseServer) renewals() []renewCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// leaseClient returns a running node client of the servers at addrs,
// with a short RPC timeout and retry.
func leaseClient(t *testing.T, addrs ...string) *nodeclient.Client {
	t.Helper()
	cfg := validConfig()
	cfg.Servers = addrs
	cfg.RPCTimeout = 2 * time.Second
	cl, err := nodeclient.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, cl)
	return cl
}

// runLeases runs l until the test ends.
func runLeases(t *testing.T, l *nodeclient.Leases) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Leases.Run: %v", err)
		}
	})
}

func newLeases(t *testing.T, cl *nodeclient.Client, dir string, lost func(nodeclient.LostWorkload)) *nodeclient.Leases {
	t.Helper()
	l, err := nodeclient.NewLeases(nodeclient.LeasesConfig{Client: cl, DataDir: dir, Lost: lost}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLeasesRenewInOneCallPerInterval holds 200 workloads with a 6 s
// lease: every renewal carries all of them, for this node, with its
// secret, and there is at most one renewal per interval (2 s) of the
// time the test ran, plus the one at start.
func TestLeasesRenewInOneCallPerInterval(t *testing.T) {
	const n, lease = 200, 6 * time.Second
	claims := map[string][]leaseClaim{}
	dir := t.TempDir()
	var want []string
	for i := range n {
		w := fmt.Sprintf("w%03d", i)
		claims[w] = []leaseClaim{{volumeID: "vol-" + w, ttl: lease}}
		want = append(want, w)
	}
	srv := newLeaseServer(t, claims)
	cl := leaseClient(t, srv.addr)
	l := newLeases(t, cl, dir, nil)
	for _, w := range want {
		if err := l.Hold("vol-"+w, w, lease); err != nil {
			t.Fatal(err)
		}
	}
	started := time.Now()
	runLeases(t, l)
	testutil.WaitFor(t, 30*time.Second, "three renewals", func() bool { return len(srv.renewals()) >= 3 })
	calls := srv.renewals()
	elapsed := time.Since(started)
	node := validConfig().Node
	for i, c := range calls {
		if c.nodeID != node.ID || c.secret != node.Secret {
			t.Errorf("renewal %d for node %q with secret %q, want node %q with its secret", i, c.nodeID, c.secret, node.ID)
		}
		if !slices.Equal(c.workloads, want) {
			t.Errorf("renewal %d carried %d workloads, want all %d in order", i, len(c.workloads), n)
		}
	}
	if most := int(elapsed/(lease/3)) + 1; len(calls) > most {
		t.Errorf("%d renewals in %v, more than one per %v interval (%d)", len(calls), elapsed, lease/3, most)
	}
}

// TestLeasesIntervalFollowsTheSmallestLease holds a workload with a
// 24 h lease (renewed every 8 h, once at start), then one with a 6 s
// lease: renewals follow within seconds, each carrying both workloads.
func TestLeasesIntervalFollowsTheSmallestLease(t *testing.T) {
	srv := newLeaseServer(t, map[string][]leaseClaim{
		"long":  {{volumeID: "v1", ttl: 24 * time.Hour}},
		"short": {{volumeID: "v2", ttl: 6 * time.Second}},
	})
	l := newLeases(t, leaseClient(t, srv.addr), t.TempDir(), nil)
	if err := l.Hold("v1", "long", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	runLeases(t, l)
	testutil.WaitFor(t, 20*time.Second, "the renewal at start", func() bool { return len(srv.renewals()) == 1 })
	if err := l.Hold("v2", "short", 6*time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "two renewals at the 6 s lease's interval", func() bool { return len(srv.renewals()) >= 3 })
	for i, c := range srv.renewals()[1:] {
		if !slices.Equal(c.workloads, []string{"long", "short"}) {
			t.Errorf("renewal %d carried %v, want [long short]", i+1, c.workloads)
		}
	}
}

// TestLeasesDropAndReportALostWorkload holds two workloads, one of
// which the servers hold no claim of: it is reported through Lost,
// dropped from what is held and from the lease file, and the next
// renewals carry the other alone.
func TestLeasesDropAndReportALostWorkload(t *testing.T) {
	srv := newLeaseServer(t, map[string][]leaseClaim{"alive": {{volumeID: "v1", ttl: 6 * time.Second}}})
	cl := leaseClient(t, srv.addr)
	dir := t.TempDir()
	lost := make(chan nodeclient.LostWorkload, 1)
	l := newLeases(t, cl, dir, func(w nodeclient.LostWorkload) { lost <- w })
	for _, h := range []nodeclient.Hold{{VolumeID: "v1", WorkloadID: "alive", Lease: 6 * time.Second},
		{VolumeID: "v2", WorkloadID: "gone", Lease: 6 * time.Second}, {VolumeID: "v3", WorkloadID: "gone", Lease: 6 * time.Second}} {
		if err := l.Hold(h.VolumeID, h.WorkloadID, h.Lease); err != nil {
			t.Fatal(err)
		}
	}
	runLeases(t, l)
	select {
	case w := <-lost:
		if w.WorkloadID != "gone" || !slices.Equal(w.VolumeIDs, []string{"v2", "v3"}) {
			t.Errorf("lost %+v, want workload gone with volumes v2 and v3", w)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no lost workload reported within 20 s")
	}
	want := []nodeclient.Hold{{VolumeID: "v1", WorkloadID: "alive", Lease: 6 * time.Second}}
	if got := l.Held(); !slices.Equal(got, want) {
		t.Errorf("Held() = %v, want %v", got, want)
	}
	if got := newLeases(t, cl, dir, nil).Held(); !slices.Equal(got, want) {
		t.Errorf("the lease file holds %v, want %v", got, want)
	}
	testutil.WaitFor(t, 20*time.Second, "a renewal after the loss", func() bool { return len(srv.renewals()) >= 2 })
	if got := srv.renewals()[1].workloads; !slices.Equal(got, []string{"alive"}) {
		t.Errorf("the renewal after the loss carried %v, want [alive]", got)
	}
}

// TestLeasesRenewAcrossFailover stops the server the node renews with:
// the renewals go on with the other one.
func TestLeasesRenewAcrossFailover(t *testing.T) {
	claims := map[string][]leaseClaim{"w": {{volumeID: "v", ttl: 6 * time.Second}}}
	first, second := newLeaseServer(t, claims), newLeaseServer(t, claims)
	l := newLeases(t, leaseClient(t, first.addr, second.addr), t.TempDir(), nil)
	if err := l.Hold("v", "w", 6*time.Second); err != nil {
		t.Fatal(err)
	}
	runLeases(t, l)
	testutil.WaitFor(t, 20*time.Second, "a renewal with the first server", func() bool { return len(first.renewals()) > 0 })
	first.srv.Stop()
	testutil.WaitFor(t, 30*time.Second, "two renewals with the second server", func() bool { return len(second.renewals()) >= 2 })
	for _, c := range second.renewals() {
		if !slices.Equal(c.workloads, []string{"w"}) {
			t.Errorf("renewal with the second server carried %v, want [w]", c.workloads)
		}
	}
}

// TestLeasesRenewAtOnceAfterRestart holds a 24 h lease (renewed every
// 8 h) and starts new Leases on the same data directory, as a restarted
// agent does: it renews the held workload at once.
func TestLeasesRenewAtOnceAfterRestart(t *testing.T) {
	srv := newLeaseServer(t, map[string][]leaseClaim{"w": {{volumeID: "v", ttl: 24 * time.Hour}}})
	cl := leaseClient(t, srv.addr)
	dir := t.TempDir()
	if err := newLeases(t, cl, dir, nil).Hold("v", "w", 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	runLeases(t, newLeases(t, cl, dir, nil))
	testutil.WaitFor(t, 20*time.Second, "a renewal at start", func() bool { return len(srv.renewals()) == 1 })
	if got := srv.renewals()[0].workloads; !slices.Equal(got, []string{"w"}) {
		t.Errorf("the renewal at start carried %v, want [w]", got)
	}
}

// TestLeaseFileRoundTrips holds and drops workloads: a new Leases on the
// same directory reads what is held, and the file is the agent's user's
// alone.
func TestLeaseFileRoundTrips(t *testing.T) {
	dir := t.TempDir()
	cl := leaseClient(t, "127.0.0.1:1")
	l := newLeases(t, cl, dir, nil)
	for _, h := range []nodeclient.Hold{{"v1", "w1", 30 * time.Second}, {"v2", "w1", time.Minute}, {"v1", "w2", 5 * time.Second}, {"v3", "w3", 24 * time.Hour}} {
		if err := l.Hold(h.VolumeID, h.WorkloadID, h.Lease); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Hold("v1", "w1", 45*time.Second); err != nil { // a new lease replaces the old
		t.Fatal(err)
	}
	if err := l.Drop("w3"); err != nil {
		t.Fatal(err)
	}
	if err := l.Drop("never-held"); err != nil {
		t.Errorf("Drop of a workload not held: %v", err)
	}
	want := []nodeclient.Hold{{"v1", "w1", 45 * time.Second}, {"v2", "w1", time.Minute}, {"v1", "w2", 5 * time.Second}}
	if got := l.Held(); !slices.Equal(got, want) {
		t.Errorf("Held() = %v, want %v", got, want)
	}
	if got := newLeases(t, cl, dir, nil).Held(); !slices.Equal(got, want) {
		t.Errorf("read back %v, want %v", got, want)
	}
	info, err := os.Stat(filepath.Join(dir, nodeclient.LeaseFileName))
	if err != nil {
		t.Fatal(err)
	}
	if mode := info.Mode().Perm(); mode != 0o600 {
		t.Errorf("lease file mode %v, want 0600", mode)
	}
}

// TestBadLeaseFileIsAnError gives NewLeases lease files it cannot use:
// each is an error naming the file and what is wrong, never a crash and
// never an empty set of holds.
func TestBadLeaseFileIsAnError(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"not JSON", "{\"version\": 1, \"holds\": [", "not a lease file"},
		{"another version", `{"version": 2, "holds": []}`, "format version 2"},
		{"unknown field", `{"version": 1, "holds": [], "extra": true}`, "unknown field"},
		{"bad lease", `{"version": 1, "holds": [{"volume_id": "v", "workload_id": "w", "lease": "soon"}]}`, `lease "soon"`},
		{"lease out of range", `{"version": 1, "holds": [{"volume_id": "v", "workload_id": "w", "lease": "1s"}]}`, "out of range"},
		{"bad workload id", `{"version": 1, "holds": [{"volume_id": "v", "workload_id": "..", "lease": "30s"}]}`, "workload_id"},
		{"held twice", `{"version": 1, "holds": [{"volume_id": "v", "workload_id": "w", "lease": "30s"}, {"volume_id": "v", "workload_id": "w", "lease": "30s"}]}`, "held twice"},
	}
	cl := leaseClient(t, "127.0.0.1:1")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, nodeclient.LeaseFileName)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := nodeclient.NewLeases(nodeclient.LeasesConfig{Client: cl, DataDir: dir}, nil)
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewLeases: err = %v, want one naming %s and %q", err, path, tt.want)
			}
		})
	}
	t.Run("a directory in its place", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, nodeclient.LeaseFileName)
		if err := os.Mkdir(path, 0o700); err != nil {
			t.Fatal(err)
		}
		_, err := nodeclient.NewLeases(nodeclient.LeasesConfig{Client: cl, DataDir: dir}, nil)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("NewLeases: err = %v, want one naming %s", err, path)
		}
	})
}

// TestHoldChecksItsArguments refuses holds the servers could never have
// admitted, with InvalidArgument naming the field, and keeps nothing of
// them.
func TestHoldChecksItsArguments(t *testing.T) {
	tests := []struct {
		name, volume, workload string
		lease                  time.Duration
		want                   string
	}{
		{"no volume", "", "w", 30 * time.Second, "volume_id"},
		{"bad volume", "a/b", "w", 30 * time.Second, "volume_id"},
		{"no workload", "v", "", 30 * time.Second, "workload_id"},
		{"dot workload", "v", ".", 30 * time.Second, "workload_id"},
		{"short lease", "v", "w", 4 * time.Second, "lease"},
		{"long lease", "v", "w", 25 * time.Hour, "lease"},
	}
	l := newLeases(t, leaseClient(t, "127.0.0.1:1"), t.TempDir(), nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := l.Hold(tt.volume, tt.workload, tt.lease)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Hold: err = %v, want InvalidArgument naming %s", err, tt.want)
			}
		})
	}
	if held := l.Held(); len(held) != 0 {
		t.Errorf("refused holds are held: %v", held)
	}
}

// TestLeasesDropVolume drops the volumes of a workload one at a time: each
// drop leaves the workload's other volumes held, in memory and in the
// lease file; the last one drops the workload, and the renewals after it
// carry the other workload alone. A volume not held, or of a workload not
// held, drops nothing; one without a volume id is refused.
func TestLeasesDropVolume(t *testing.T) {
	const lease = 6 * time.Second
	srv := newLeaseServer(t, map[string][]leaseClaim{
		"w": {{volumeID: "v1", ttl: lease}, {volumeID: "v2", ttl: lease}},
		"x": {{volumeID: "v1", ttl: lease}},
	})
	cl := leaseClient(t, srv.addr)
	dir := t.TempDir()
	l := newLeases(t, cl, dir, nil)
	for _, h := range []nodeclient.Hold{{"v1", "w", lease}, {"v2", "w", lease}, {"v1", "x", lease}} {
		if err := l.Hold(h.VolumeID, h.WorkloadID, h.Lease); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		volume, workload string
		want             []nodeclient.Hold
	}{
		{"v1", "w", []nodeclient.Hold{{"v2", "w", lease}, {"v1", "x", lease}}},
		{"v1", "w", []nodeclient.Hold{{"v2", "w", lease}, {"v1", "x", lease}}}, // dropped already
		{"v9", "x", []nodeclient.Hold{{"v2", "w", lease}, {"v1", "x", lease}}}, // never held
		{"v1", "nobody", []nodeclient.Hold{{"v2", "w", lease}, {"v1", "x", lease}}},
		{"v2", "w", []nodeclient.Hold{{"v1", "x", lease}}},
	}
	for i, s := range steps {
		if err := l.DropVolume(s.volume, s.workload); err != nil {
			t.Fatalf("step %d: DropVolume(%s, %s): %v", i, s.volume, s.workload, err)
		}
		if got := l.Held(); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: after DropVolume(%s, %s) Held() = %v, want %v", i, s.volume, s.workload, got, s.want)
		}
		if got := newLeases(t, cl, dir, nil).Held(); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: the lease file holds %v, want %v", i, got, s.want)
		}
	}
	if err := l.DropVolume("", "x"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "volume_id") {
		t.Errorf("DropVolume without a volume: %v, want InvalidArgument naming volume_id", err)
	}
	runLeases(t, l)
	testutil.WaitFor(t, 20*time.Second, "the renewal at start", func() bool { return len(srv.renewals()) >= 1 })
	if got := srv.renewals()[0].workloads; !slices.Equal(got, []string{"x"}) {
		t.Errorf("the renewal after the last volume of w was dropped carried %v, want [x]", got)
	}
}
