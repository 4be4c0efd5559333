package registry

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// fakeRegistrar serves a registration socket that accepts connections and
// then never answers (hang) or writes garbage and hangs up. It counts the
// connections it accepted.
type fakeRegistrar struct {
	lis      net.Listener
	mu       sync.Mutex
	accepted int
	conns    []net.Conn
	done     chan struct{}
}

func startFakeRegistrar(t *testing.T, socket string, garbage bool) *fakeRegistrar {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRegistrar{lis: lis, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.accepted++
			if garbage {
				_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\nnot a registrar\n"))
				_ = c.Close()
			} else {
				f.conns = append(f.conns, c)
			}
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = lis.Close()
		<-f.done
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.conns {
			_ = c.Close()
		}
	})
	return f
}

func (f *fakeRegistrar) connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.accepted
}

// More registration sockets than MaxRegistrationCalls that never answer
// are handled MaxRegistrationCalls at a time, and every one of them gets
// its turn.
func TestRegistrationCallsCapped(t *testing.T) {
	root := testutil.TempDir(t)
	regDir := filepath.Join(root, "reg")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	const n = MaxRegistrationCalls + 36
	hung := make([]*fakeRegistrar, n)
	for i := range hung {
		hung[i] = startFakeRegistrar(t, filepath.Join(regDir, "h"+strconv.Itoa(i)+"-reg.sock"), false)
	}
	m := newTestManager(t, ManagerConfig{
		PluginDir:              filepath.Join(root, "plugins"),
		KubeletRegistrationDir: regDir,
		ProbeInterval:          10 * time.Second,
		ProbeTimeout:           2 * time.Second, // each hung call holds its slot this long
	})
	runManager(t, m)
	calls := func() *callLimiter {
		if w := m.watcher.Load(); w != nil {
			return w.cfg.Kubelet.calls
		}
		return nil
	}
	testutil.WaitFor(t, 20*time.Second, "every slot taken", func() bool {
		l := calls()
		if l == nil {
			return false
		}
		inFlight, _ := l.counts()
		return inFlight == MaxRegistrationCalls
	})
	testutil.WaitFor(t, 30*time.Second, "every socket asked", func() bool {
		return !slices.ContainsFunc(hung, func(f *fakeRegistrar) bool { return f.connections() == 0 })
	})
	if _, peak := calls().counts(); peak != MaxRegistrationCalls {
		t.Fatalf("%d calls ran at once at most, want %d (the cap)", peak, MaxRegistrationCalls)
	}
}

// A registration socket that answers garbage is asked again after waits
// that grow by the retry policy up to its cap, one connection per
// attempt: it is never redialled in a loop.
func TestRegistrationGarbageBacksOff(t *testing.T) {
	root := testutil.TempDir(t)
	regDir := filepath.Join(root, "reg")
	if err := os.MkdirAll(regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	f := startFakeRegistrar(t, filepath.Join(regDir, "junk-reg.sock"), true)
	ms := time.Millisecond
	m := newTestManager(t, ManagerConfig{
		PluginDir:              filepath.Join(root, "plugins"),
		KubeletRegistrationDir: regDir,
		KubeletRetry:           retry.Policy{Base: 20 * ms, Cap: 80 * ms, Multiplier: 2},
	})
	var mu sync.Mutex
	var waits []time.Duration
	m.onRegistrationRetry = func(_ string, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		waits = append(waits, d)
	}
	runManager(t, m)
	got := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(waits)
	}
	testutil.WaitFor(t, 20*time.Second, "five retries", func() bool { return len(got()) >= 5 })
	w := got()
	if want := []time.Duration{20 * ms, 40 * ms, 80 * ms, 80 * ms, 80 * ms}; !slices.Equal(w[:5], want) {
		t.Errorf("waits between attempts = %v, want %v", w[:5], want)
	}
	// Each attempt made one connection; one more may be under way.
	if c := f.connections(); c > len(got())+1 {
		t.Errorf("%d connections for %d attempts: the garbage socket was redialled", c, len(w))
	}
}

// Whatever the policy, a registration socket is asked at least once a
// minute; the agent's policy grows from twenty seconds to that minute.
func TestRegistrationWaitCapped(t *testing.T) {
	tests := []struct {
		name      string
		p         retry.Policy
		firstMax  time.Duration
		reachesAt int // the wait that is at least half a minute
	}{
		{"the agent's policy", config.DefaultRetry().KubeletRegistration, 30 * time.Second, 3},
		{"a policy capped above a minute", retry.Policy{Base: 10 * time.Second, Cap: 10 * time.Minute, Multiplier: 2, Jitter: 0.5}, 15 * time.Second, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.p.NewBackOff()
			for i := 1; i <= 40; i++ {
				d := registrationWait(b)
				switch {
				case d > time.Minute:
					t.Fatalf("wait %d is %s, over a minute", i, d)
				case i == 1 && d > tt.firstMax:
					t.Fatalf("first wait %s, want at most %s", d, tt.firstMax)
				case i >= tt.reachesAt && d < 30*time.Second:
					t.Fatalf("wait %d is %s; want the waits grown to half a minute or more by then", i, d)
				}
			}
		})
	}
}
