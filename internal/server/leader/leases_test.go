package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testutil"
)

// expiries is the lease table's LeaseWork in these tests: it records
// each expiry asked for, and answers as its answer func says (nil: done).
type expiries struct {
	mu     sync.Mutex
	calls  []string
	answer func(call int) (bool, error)
}

func (x *expiries) ExpireLease(ctx context.Context, ref rules.Ref, claimIndex uint64) (bool, error) {
	x.mu.Lock()
	x.calls = append(x.calls, fmt.Sprintf("%s/%s/%s/%d", ref.VolumeID, ref.NodeID, ref.WorkloadID, claimIndex))
	n := len(x.calls)
	answer := x.answer
	x.mu.Unlock()
	if answer == nil {
		return true, nil
	}
	return answer(n)
}

func (x *expiries) called() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.calls)
}

// leaseEnv is a lease table over a state store the test writes.
type leaseEnv struct {
	t  *testing.T
	st *state.Store
	x  *expiries
	l  *Leases
}

func newLeaseEnv(t *testing.T, vols ...*statepb.Volume) *leaseEnv {
	st, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	env := &leaseEnv{t: t, st: st, x: &expiries{}}
	env.put(vols...)
	env.l = NewLeases(LeaseConfig{
		State: func() *state.Store { return st }, Work: env.x,
		RetryInterval: 5 * time.Millisecond, ExpireTimeout: waitTimeout,
	}, nil)
	t.Cleanup(env.l.Stop)
	return env
}

func (env *leaseEnv) put(vols ...*statepb.Volume) {
	txn := env.st.Write()
	defer txn.Abort()
	for _, v := range vols {
		if err := txn.PutVolume(proto.Clone(v).(*statepb.Volume)); err != nil {
			env.t.Fatal(err)
		}
	}
	txn.Commit()
}

// leased is a taken claim of workload w on node n, taken at index, with a
// lease of ttl (0: none).
func leased(n, w string, index uint64, ttl time.Duration) *statepb.VolumeClaim {
	c := &statepb.VolumeClaim{NodeId: n, WorkloadId: w, State: rules.StateTaken, ClaimIndex: index, Mounted: true}
	if ttl > 0 {
		c.LeaseTtl = durationpb.New(ttl)
	}
	return c
}

func vol(id string, claims ...*statepb.VolumeClaim) *statepb.Volume {
	return &statepb.Volume{Id: id, PluginId: "p", Claims: claims}
}

func TestLeasesSeedAtTermStart(t *testing.T) {
	releasing := leased("n1", "w4", 4, time.Hour)
	releasing.State = rules.StateUnpublishing
	env := newLeaseEnv(t,
		vol("v1", leased("n1", "w1", 1, time.Hour), leased("n2", "w2", 2, time.Hour)),
		vol("v2", leased("n1", "w3", 3, 0), releasing),
	)
	env.l.Add(rules.Ref{VolumeID: "v9", NodeID: "n1", WorkloadID: "w9"}, 9, time.Hour)
	if n := env.l.Count(); n != 0 {
		t.Fatalf("a table not leading holds %d leases, want 0", n)
	}
	before := time.Now()
	env.l.Initialize(context.Background())
	if n := env.l.Count(); n != 2 {
		t.Fatalf("seeded %d leases, want the 2 taken claims with a lease", n)
	}
	renewed, deadline, ok := env.l.Times(rules.Ref{VolumeID: "v1", NodeID: "n2", WorkloadID: "w2"}, 2)
	if !ok || renewed.Before(before) || deadline.Sub(renewed) != time.Hour {
		t.Fatalf("seeded lease: renewed %v, deadline %v, %v; want a full TTL from the term's start (%v)", renewed, deadline, ok, before)
	}
	if _, _, ok := env.l.Times(rules.Ref{VolumeID: "v2", NodeID: "n1", WorkloadID: "w4"}, 4); ok {
		t.Fatal("a claim being released has a lease")
	}
	env.l.Clear()
	if _, _, ok := env.l.Times(rules.Ref{VolumeID: "v1", NodeID: "n2", WorkloadID: "w2"}, 2); ok || env.l.Count() != 0 {
		t.Fatal("a cleared table still answers")
	}
	if _, _, err := env.l.Renew("n1", []string{"w1"}); !errors.Is(err, ErrNotLeading) {
		t.Fatalf("Renew on a table not leading: %v, want ErrNotLeading", err)
	}
}

func TestLeasesRenew(t *testing.T) {
	env := newLeaseEnv(t,
		vol("v1", leased("n1", "w1", 1, time.Hour), leased("n2", "w1", 2, time.Hour)),
		vol("v2", leased("n1", "w1", 3, time.Hour), leased("n1", "plain", 4, 0)),
		vol("v3", leased("n1", "gone", 5, time.Hour)),
	)
	env.l.Initialize(context.Background())
	ref := rules.Ref{VolumeID: "v1", NodeID: "n1", WorkloadID: "w1"}
	first, _, _ := env.l.Times(ref, 1)

	// The claim of "gone" is released behind the table's back.
	env.put(vol("v3"))
	renewed, lost, err := env.l.Renew("n1", []string{"w1", "plain", "gone", "never"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range renewed {
		got = append(got, fmt.Sprintf("%s/%s/%s/%d", r.Ref.VolumeID, r.Ref.NodeID, r.Ref.WorkloadID, r.ClaimIndex))
		if r.TTL != time.Hour || r.Deadline.Before(first) {
			t.Errorf("renewal %+v: want a TTL of 1h and a deadline not before the first %v", r, first)
		}
	}
	if want := []string{"v1/n1/w1/1", "v2/n1/w1/3"}; !slices.Equal(got, want) {
		t.Fatalf("renewed %v, want %v (only node n1's leased claims of w1)", got, want)
	}
	if want := []string{"gone", "never"}; !slices.Equal(lost, want) {
		t.Fatalf("lost %v, want %v (a workload with a claim without a lease is not lost)", lost, want)
	}
	if n := env.l.Count(); n != 3 {
		t.Fatalf("%d leases after the renewal, want 3: the released claim's lease leaves the table", n)
	}
	renewedAt, deadline, _ := env.l.Times(ref, 1)
	if renewedAt.Before(first) || deadline.Sub(renewedAt) != time.Hour {
		t.Fatalf("after the renewal: renewed %v, deadline %v; want a full TTL from the renewal", renewedAt, deadline)
	}
}

func TestLeasesExpireOnce(t *testing.T) {
	env := newLeaseEnv(t, vol("v1", leased("n1", "w1", 1, 20*time.Millisecond), leased("n1", "w2", 2, time.Hour)))
	env.l.Initialize(context.Background())
	testutil.WaitFor(t, waitTimeout, "the lease to leave the table after its expiry", func() bool { return env.l.Count() == 1 })
	env.l.Stop()
	if got := env.x.called(); !slices.Equal(got, []string{"v1/n1/w1/1"}) {
		t.Fatalf("expiries %v, want one of v1/n1/w1/1", got)
	}
}

func TestLeasesExpiryRetries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(call int) (bool, error)
	}{
		{"the node is down", func(call int) (bool, error) { return call >= 3, nil }},
		{"the write fails", func(call int) (bool, error) {
			if call < 3 {
				return false, errors.New("no leader")
			}
			return true, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newLeaseEnv(t, vol("v1", leased("n1", "w1", 1, 10*time.Millisecond)))
			env.x.answer = tc.answer
			env.l.Initialize(context.Background())
			testutil.WaitFor(t, waitTimeout, "the lease to leave the table", func() bool { return env.l.Count() == 0 })
			env.l.Stop()
			if n := len(env.x.called()); n != 3 {
				t.Fatalf("%d expiries, want 3: tried again until done, then never", n)
			}
		})
	}
}

// TestLeasesExpiredAreNotRevived checks that a renewal after a lease's
// deadline, while its expiry runs, does not renew it, and reports its
// workload lost, as does a claim again (Add).
func TestLeasesExpiredAreNotRevived(t *testing.T) {
	env := newLeaseEnv(t, vol("v1", leased("n1", "w1", 1, 10*time.Millisecond)))
	entered, release := make(chan struct{}), make(chan struct{})
	env.x.answer = func(int) (bool, error) {
		close(entered)
		<-release
		return true, nil
	}
	env.l.Initialize(context.Background())
	<-entered
	ref := rules.Ref{VolumeID: "v1", NodeID: "n1", WorkloadID: "w1"}
	env.l.Add(ref, 1, time.Hour)
	renewed, lost, err := env.l.Renew("n1", []string{"w1"})
	close(release)
	if err != nil || len(renewed) != 0 || !slices.Equal(lost, []string{"w1"}) {
		t.Fatalf("Renew during the expiry: %v, lost %v, %v; want nothing renewed and w1 lost", renewed, lost, err)
	}
	testutil.WaitFor(t, waitTimeout, "the expired lease to leave the table", func() bool { return env.l.Count() == 0 })
}

// TestLeasesAdd checks that a claim taken while leading gets a lease, a
// claim again renews it, and a restore reseeds the table.
func TestLeasesAdd(t *testing.T) {
	env := newLeaseEnv(t)
	env.l.Initialize(context.Background())
	ref := rules.Ref{VolumeID: "v1", NodeID: "n1", WorkloadID: "w1"}
	env.l.Add(ref, 1, 0)
	if env.l.Count() != 0 {
		t.Fatal("a claim without a lease was added")
	}
	env.l.Add(ref, 1, time.Hour)
	env.l.Add(ref, 1, time.Hour)
	if env.l.Count() != 1 {
		t.Fatalf("%d leases after a claim and a claim again, want 1", env.l.Count())
	}
	// The state never held the claim: a restore's seeding drops it.
	env.put(vol("v2", leased("n1", "w2", 2, time.Hour)))
	env.l.Restored()
	if _, _, ok := env.l.Times(rules.Ref{VolumeID: "v2", NodeID: "n1", WorkloadID: "w2"}, 2); !ok || env.l.Count() != 1 {
		t.Fatalf("after a restore: %d leases, want only the restored state's", env.l.Count())
	}
}

// BenchmarkLeasesRenew measures one node's renewal of its 10 leased
// claims among 10,000 on 1,000 nodes: the leader's steady-state cost.
func BenchmarkLeasesRenew(b *testing.B) {
	st, err := state.New()
	if err != nil {
		b.Fatal(err)
	}
	txn := st.Write()
	for n := range 1000 {
		for w := range 10 {
			c := leased(fmt.Sprint("n", n), fmt.Sprint("w", w), uint64(n*10+w+1), time.Hour)
			if err := txn.PutVolume(vol(fmt.Sprint("v", n, "-", w), c)); err != nil {
				b.Fatal(err)
			}
		}
	}
	txn.Commit()
	l := NewLeases(LeaseConfig{State: func() *state.Store { return st }, Work: &expiries{}, RetryInterval: time.Second, ExpireTimeout: time.Second}, nil)
	defer l.Stop()
	l.Initialize(context.Background())
	workloads := []string{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9"}
	nodes := make([]string, 1000)
	for i := range nodes {
		nodes[i] = fmt.Sprint("n", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		renewed, _, err := l.Renew(nodes[i%len(nodes)], workloads)
		if err != nil || len(renewed) != 10 {
			b.Fatalf("renewed %d, %v", len(renewed), err)
		}
	}
}
