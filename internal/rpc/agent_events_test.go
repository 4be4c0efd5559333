package rpc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// serveAgent serves svc with a real gRPC server, on a listener of
// TagConns as the agent does, on a loopback TCP port or a unix socket ("tcp" or
// "unix"), and returns the address to dial. It stops with the test.
func serveAgent(t testing.TB, svc *AgentService, network string) string {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(testutil.TempDir(t), "agent.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	svc.Register(srv)
	testutil.ServeGRPC(t, TagConns(ln), srv)
	if network == "unix" {
		return "unix://" + addr
	}
	return ln.Addr().String()
}

// dialAgent opens a new transport connection to addr; it closes with the
// test.
func dialAgent(t testing.TB, addr string, opts ...grpc.DialOption) csisupdv1.AgentClient {
	t.Helper()
	return csisupdv1.NewAgentClient(testutil.DialGRPC(t, addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...))
}

// newAgentService is NewAgentService with the configuration's subscriber
// caps where cfg has none; it fails the test on an error.
func newAgentService(tb testing.TB, cfg AgentServiceConfig) *AgentService {
	tb.Helper()
	if cfg.MaxSubscribers == 0 {
		cfg.MaxSubscribers = config.DefaultMaxEventSubscribers
	}
	if cfg.MaxSubscribersPerConn == 0 {
		cfg.MaxSubscribersPerConn = config.DefaultMaxEventSubscribersPerConn
	}
	if cfg.LogLevels == nil {
		cfg.LogLevels = config.LogLevels()
	}
	svc, err := NewAgentService(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return svc
}

// emit adds n events to reg, each a new instance of plugin p<i%plugins>
// with a description of about descLen bytes, and returns the latest index.
func emit(reg *registry.Registry, n, plugins, descLen int) uint64 {
	_, latest := reg.EventLog().Range()
	for i := range n {
		id := fmt.Sprintf("p%d", i%plugins)
		path := "/var/lib/csisupd/plugins/" + id + "/csi.sock"
		if pad := descLen - len(path); pad > 0 {
			path += strings.Repeat("x", pad)
		}
		reg.Register(id, plugin.Instance{Path: path, Inode: latest + uint64(i) + 1}, nil)
	}
	_, latest = reg.EventLog().Range()
	return latest
}

// recvIndexes receives n events and returns their indexes.
func recvIndexes(t *testing.T, s grpc.ServerStreamingClient[csisupdv1.Event], n int) []uint64 {
	t.Helper()
	var got []uint64
	for range n {
		e, err := s.Recv()
		if err != nil {
			t.Fatalf("after events %v: Recv: %v", got, err)
		}
		got = append(got, e.GetIndex())
	}
	return got
}

func span(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// A stream replays what it asked for from the log, then follows new
// events, each exactly once and in order.
func TestWatchEventsReplayAndFollow(t *testing.T) {
	// 100 events in a log of 64: 37 to 100 are buffered.
	tests := []struct {
		name   string
		replay int32
		plugin string
		want   []uint64 // before the 3 followed events 101-103
	}{
		{"all buffered", 0, "", span(37, 100)},
		{"none", -1, "", nil},
		{"last 5", 5, "", span(96, 100)},
		{"more than buffered", 1000, "", span(37, 100)},
		{"one plugin", 0, "p3", []uint64{44, 54, 64, 74, 84, 94}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := registry.New(registry.Config{EventBuffer: 64})
			emit(reg, 100, 10, 40)
			svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog()})
			cl := dialAgent(t, serveAgent(t, svc, "tcp"))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: tt.replay, PluginId: tt.plugin})
			if err != nil {
				t.Fatal(err)
			}
			got := recvIndexes(t, s, len(tt.want))
			// The replay is sent; events emitted from now on are followed.
			testutil.WaitFor(t, 10*time.Second, "the stream to wait for new events", func() bool {
				return svc.caughtUp.Load() == 1
			})
			emit(reg, 3, 10, 40)                                              // 101 (p0), 102 (p1), 103 (p2)
			reg.Register("p3", plugin.Instance{Path: "/p3", Inode: 999}, nil) // 104
			want := append(slices.Clone(tt.want), 101, 102, 103, 104)
			if tt.plugin != "" {
				want = append(slices.Clone(tt.want), 104)
			}
			got = append(got, recvIndexes(t, s, len(want)-len(got))...)
			if !slices.Equal(got, want) {
				t.Errorf("indexes = %v, want %v", got, want)
			}
		})
	}
}

// Streams beyond client.max_event_subscribers, or beyond
// client.max_event_subscribers_per_connection on one transport connection,
// end at once with ResourceExhausted naming the cap and its key; accepted
// ones stay within both caps, and a closed stream frees its slot.
func TestWatchEventsCaps(t *testing.T) {
	const totalKey, connKey = "client.max_event_subscribers)", "client.max_event_subscribers_per_connection)"
	tests := []struct {
		name       string
		network    string
		max, per   int
		streams    []int // streams opened on each connection, in order
		wantOpen   []int // accepted per connection
		wantRefuse map[string]int
	}{
		{"total cap", "tcp", 3, 3, []int{5}, []int{3}, map[string]int{totalKey: 2}},
		{"per connection cap", "tcp", 10, 2, []int{3, 2}, []int{2, 2}, map[string]int{connKey: 1}},
		{"both", "tcp", 5, 3, []int{4, 4}, []int{3, 2}, map[string]int{connKey: 1, totalKey: 2}},
		// Every unix socket peer has the same address: TagConns still
		// tells the connections apart.
		{"per connection cap on a unix socket", "unix", 10, 2, []int{3, 3}, []int{2, 2}, map[string]int{connKey: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := registry.New(registry.Config{})
			svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), MaxSubscribers: tt.max, MaxSubscribersPerConn: tt.per})
			addr := serveAgent(t, svc, tt.network)
			type result struct {
				conn int
				err  error
			}
			results := make(chan result, 100)
			var cancels []context.CancelFunc
			defer func() {
				for _, c := range cancels {
					c()
				}
			}()
			var lastOpen context.CancelFunc
			for c, n := range tt.streams {
				cl := dialAgent(t, addr)
				for range n {
					ctx, cancel := context.WithCancel(context.Background())
					cancels = append(cancels, cancel)
					// Streams are opened one by one, so which are refused
					// is determined: wait for each to be accepted (the
					// count rises) or refused (Recv fails).
					before, _ := svc.Subscribers()
					s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: -1})
					if err != nil {
						t.Fatal(err)
					}
					done := make(chan error, 1)
					go func() {
						_, err := s.Recv()
						done <- err
					}()
					testutil.WaitFor(t, 10*time.Second, "the stream to be served or refused", func() bool {
						n, _ := svc.Subscribers()
						return len(done) > 0 || n > before
					})
					if len(done) > 0 {
						results <- result{c, <-done}
					} else {
						lastOpen = cancel
						results <- result{c, nil}
					}
				}
			}
			close(results)
			open := make([]int, len(tt.streams))
			refused := map[string]int{}
			for r := range results {
				if r.err == nil {
					open[r.conn]++
					continue
				}
				st := status.Convert(r.err)
				if st.Code() != codes.ResourceExhausted {
					t.Errorf("refused with %v, want ResourceExhausted", r.err)
				}
				key := "no key"
				for _, k := range []string{totalKey, connKey} {
					if strings.Contains(st.Message(), k) {
						key = k
					}
				}
				refused[key]++
			}
			if !slices.Equal(open, tt.wantOpen) {
				t.Errorf("accepted per connection = %v, want %v", open, tt.wantOpen)
			}
			if fmt.Sprint(refused) != fmt.Sprint(tt.wantRefuse) {
				t.Errorf("refusals by cap = %v, want %v", refused, tt.wantRefuse)
			}
			if n, conns := svc.Subscribers(); n > tt.max || n != sum(tt.wantOpen) || conns != len(tt.streams) {
				t.Errorf("server counts %d streams on %d connections, want %d on %d", n, conns, sum(tt.wantOpen), len(tt.streams))
			}
			// Closing a stream frees its slot on the server.
			lastOpen()
			testutil.WaitFor(t, 10*time.Second, "the closed stream's slot to be freed", func() bool {
				n, _ := svc.Subscribers()
				return n == sum(tt.wantOpen)-1
			})
		})
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// A subscriber that stops reading while more events than the log's lag
// limit are emitted ends with ResourceExhausted, "fell behind ... resume
// from index N" and the EventsFellBehind detail, after every event it was
// sent up to N; the registry never waited for it. A stream from N then
// continues with no gap and no duplicate, and a resume that comes after
// those events left the log is refused with OutOfRange and EventsGone.
func TestWatchEventsFellBehindAndResume(t *testing.T) {
	const size, maxLag = 256, 128
	reg := registry.New(registry.Config{EventBuffer: size, EventMaxLag: maxLag})
	pr := prometheus.NewRegistry()
	svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), Metrics: pr})
	// A fixed 64 KiB window (no BDP growth): the server can send only so
	// much to a client that does not read.
	cl := dialAgent(t, serveAgent(t, svc, "tcp"),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	emit(reg, 1, 10, 4096)
	// Bounded: a stream that skipped events instead of ending would
	// otherwise keep the Recv loops below waiting for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := recvIndexes(t, s, 1)

	// 200 events of 4 KiB while the client reads nothing: the stream
	// blocks in Send after about 128 KiB (window plus gRPC's write
	// quota), or is cut at once if the burst outran it, either way far
	// more than maxLag events behind and less than size behind.
	emitted := make(chan uint64, 1)
	go func() { emitted <- emit(reg, 200, 10, 4096) }()
	var latest uint64
	select {
	case latest = <-emitted:
	case <-time.After(10 * time.Second):
		t.Fatal("emitting 200 events took over 10s: the registry waited for a subscriber")
	}

	var recvErr error
	for {
		e, err := s.Recv()
		if err != nil {
			recvErr = err
			break
		}
		got = append(got, e.GetIndex())
	}
	last := got[len(got)-1]
	if !slices.Equal(got, span(1, last)) {
		t.Errorf("received %v, want every index from 1 to %d", got, last)
	}
	st := status.Convert(recvErr)
	fell, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsFellBehind](recvErr)
	var lag, limit, resume uint64
	_, scanErr := fmt.Sscanf(st.Message(), "fell behind: %d events behind the newest (at most %d); resume from index %d", &lag, &limit, &resume)
	switch {
	case st.Code() != codes.ResourceExhausted || !ok:
		t.Fatalf("stream ended with %v, want ResourceExhausted with EventsFellBehind", recvErr)
	case fell.GetResumeIndex() != last:
		t.Errorf("resume index %d, want %d (the last event received)", fell.GetResumeIndex(), last)
	case scanErr != nil || resume != last || limit != maxLag || lag <= maxLag || lag != fell.GetLag():
		t.Errorf("message %q does not say how far behind (more than %d) and where to resume (%d)", st.Message(), maxLag, last)
	}
	testutil.WaitFor(t, 10*time.Second, "the dropped subscriber's slot to be freed", func() bool {
		n, _ := svc.Subscribers()
		return n == 0
	})
	want := `
# HELP csisupd_event_subscribers_dropped_total Event stream subscriptions ended because they fell behind the event log (EventsFellBehind, or EventsGone after they started).
# TYPE csisupd_event_subscribers_dropped_total counter
csisupd_event_subscribers_dropped_total 1
`
	if err := promtest.GatherAndCompare(pr, strings.NewReader(want), "csisupd_event_subscribers_dropped_total"); err != nil {
		t.Errorf("the stream that fell behind: %v", err)
	}

	// The resume: every event after the last one received, then new ones.
	from := fell.GetResumeIndex()
	resumed, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{FromIndex: &from})
	if err != nil {
		t.Fatal(err)
	}
	if got := recvIndexes(t, resumed, int(latest-from)); !slices.Equal(got, span(from+1, latest)) {
		t.Errorf("resumed stream: %v, want %d to %d", got, from+1, latest)
	}
	emit(reg, 1, 10, 10)
	if got := recvIndexes(t, resumed, 1); got[0] != latest+1 {
		t.Errorf("then followed %v, want %d", got, latest+1)
	}

	// Too late: the events after from have left the log.
	emit(reg, size, 10, 10)
	late, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{FromIndex: &from})
	if err != nil {
		t.Fatal(err)
	}
	_, err = late.Recv()
	gone, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsGone](err)
	if status.Code(err) != codes.OutOfRange || !ok || gone.GetAfter() != from {
		t.Errorf("late resume: %v (detail %v), want OutOfRange with EventsGone after %d", err, gone, from)
	}
}

// csisupd_event_subscribers counts the open WatchEvents streams of real
// clients: it goes up as streams open and down as they end.
func TestWatchEventsSubscriberGauge(t *testing.T) {
	reg := registry.New(registry.Config{})
	pr := prometheus.NewRegistry()
	svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), Metrics: pr})
	cl := dialAgent(t, serveAgent(t, svc, "tcp"))
	gauge := func() float64 {
		t.Helper()
		families, err := pr.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "csisupd_event_subscribers" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("csisupd_event_subscribers not gathered")
		return 0
	}
	if got := gauge(); got != 0 {
		t.Fatalf("csisupd_event_subscribers = %v before any stream, want 0", got)
	}

	var cancels []context.CancelFunc
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cancels = append(cancels, cancel)
		if _, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: -1}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%d streams counted", i+1), func() bool { return gauge() == float64(i+1) })
	}
	for i, cancel := range cancels {
		cancel()
		left := float64(len(cancels) - i - 1)
		testutil.WaitFor(t, 10*time.Second, fmt.Sprintf("%v streams counted", left), func() bool { return gauge() == left })
	}
	want := `
# HELP csisupd_event_subscribers Open event stream subscriptions (WatchEvents).
# TYPE csisupd_event_subscribers gauge
csisupd_event_subscribers 0
# HELP csisupd_event_subscribers_dropped_total Event stream subscriptions ended because they fell behind the event log (EventsFellBehind, or EventsGone after they started).
# TYPE csisupd_event_subscribers_dropped_total counter
csisupd_event_subscribers_dropped_total 0
`
	if err := promtest.GatherAndCompare(pr, strings.NewReader(want)); err != nil {
		t.Errorf("streams the clients closed: %v", err)
	}
}

// NewAgentService fails when its series cannot be registered.
func TestNewAgentServiceReturnsMetricsRegistrationErrors(t *testing.T) {
	reg := registry.New(registry.Config{})
	pr := prometheus.NewRegistry()
	newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), Metrics: pr})
	_, err := NewAgentService(AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), Metrics: pr,
		MaxSubscribers: config.DefaultMaxEventSubscribers, MaxSubscribersPerConn: config.DefaultMaxEventSubscribersPerConn})
	if err == nil || !strings.Contains(err.Error(), "event stream metrics") {
		t.Errorf("a second service on the same registry: %v, want a metrics registration error", err)
	}
}

// blockedStream is a WatchEvents stream whose client never reads: Send
// blocks until the stream's context ends.
type blockedStream struct {
	grpc.ServerStream
	ctx     context.Context
	blocked chan struct{} // closed when Send first blocks
	once    sync.Once
}

func (s *blockedStream) Context() context.Context { return s.ctx }

func (s *blockedStream) Send(*csisupdv1.Event) error {
	s.once.Do(func() { close(s.blocked) })
	<-s.ctx.Done()
	return s.ctx.Err()
}

// A stream blocked in Send holds one batch of events, not the backlog:
// 2,000 of them over a full log of 1,024 events cost less than 8 MiB of
// heap (a copy of the backlog each would be 160 MiB). gRPC's own buffers
// are left out here; TestWatchEventsIdleSubscribers measures the whole.
func TestWatchEventsBlockedSendHoldsOneBatch(t *testing.T) {
	const streams = 2000
	reg := registry.New(registry.Config{EventBuffer: 1024})
	emit(reg, 1024, 20, 80)
	svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), MaxSubscribers: streams, MaxSubscribersPerConn: streams})
	before := heapInUse()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	for i := range streams {
		onConn := peer.NewContext(ctx, &peer.Peer{Addr: taggedAddr{id: uint64(i)}})
		s := &blockedStream{ctx: onConn, blocked: make(chan struct{})}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = svc.WatchEvents(&csisupdv1.WatchEventsRequest{}, s)
		}()
		select {
		case <-s.blocked:
		case <-time.After(10 * time.Second):
			t.Fatal("stream did not send within 10s")
		}
	}
	growth := heapInUse() - before
	t.Logf("%d streams blocked in Send: heap +%.1f MiB, %.1f KiB per stream", streams, mib(growth), float64(growth)/streams/1024)
	if growth > 8<<20 {
		t.Errorf("heap grew by %.1f MiB for %d blocked streams, want < 8 MiB", mib(growth), streams)
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// Environment of the helper process of TestWatchEventsIdleSubscribers.
const (
	helperAddrEnv    = "CSISUPD_TEST_WATCH_ADDR"
	helperStreamsEnv = "CSISUPD_TEST_WATCH_STREAMS"
)

// TestWatchEventsHelperProcess is not a test: run by
// TestWatchEventsIdleSubscribers in a child process, it opens event
// streams that never read, like the outside tester's clients, so that the
// parent's heap holds the agent's side only.
func TestWatchEventsHelperProcess(t *testing.T) {
	addr := os.Getenv(helperAddrEnv)
	if addr == "" {
		t.Skip("helper process of TestWatchEventsIdleSubscribers")
	}
	n, err := strconv.Atoi(os.Getenv(helperStreamsEnv))
	if err != nil {
		t.Fatal(err)
	}
	const conns = 20
	// Fixed 64 KiB windows, the smallest a gRPC client announces and no
	// growth by BDP estimation: once a stream's window is full the agent
	// can send it nothing more.
	var clients []csisupdv1.AgentClient
	for range conns {
		clients = append(clients, dialAgent(t, addr,
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range n {
		if _, err := clients[i%conns].WatchEvents(ctx, &csisupdv1.WatchEventsRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("ready")
	// Hold the streams until the parent closes stdin, at most 5 minutes.
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-time.After(5 * time.Minute):
	}
	os.Exit(0) // the parent only waits for the exit; skip goleak's wait
}

// startHelper runs TestWatchEventsHelperProcess against addr with n
// streams and waits until it has opened them. It ends with the test.
func startHelper(t testing.TB, addr string, n int) {
	t.Helper()
	helper := exec.Command(os.Args[0], "-test.run=^TestWatchEventsHelperProcess$", "-test.count=1")
	helper.Env = append(os.Environ(), helperAddrEnv+"="+addr, helperStreamsEnv+"="+strconv.Itoa(n))
	helper.Stderr = os.Stderr
	stdin, err := helper.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = helper.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = helper.Process.Kill()
			<-exited
		}
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("helper said %q", line)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("helper process: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("helper process not ready after 60s")
	}
}

// 2,000 event streams that never read:
//   - with the default caps, all but 256 are refused with
//     ResourceExhausted, and none of 10 connections holds more than 32;
//   - with the caps raised to 2,000, all are served: each replays a full
//     log, fills its client's window and gRPC's write quota, and blocks in
//     Send holding one event. The agent's heap grows by less than 64 MiB
//     (the clients run in another process, as the outside tester's did),
//     and a subscriber that reads still gets every new event. How soon it
//     gets them (the target: 10 ms at the 99th percentile) is a timing, so
//     BenchmarkEventLatencyStalledSubscribers measures it (make bench).
//
// The events are 1 KiB: a stream stalls only once its replay exceeds the
// client's window and gRPC's write quota (128 KiB in all), and the
// memory of a stalled stream is mostly gRPC's bookkeeping of the frames
// it queued (the messages themselves are shared), so it grows with the
// number of queued messages, not the backlog: about 11 KiB per stream
// here, about 38 KiB with 150-byte events (74 MiB for 2,000 streams; the
// default cap of 256 bounds it to about 10 MiB).
func TestWatchEventsIdleSubscribers(t *testing.T) {
	const streams = 2000
	t.Run("default caps", func(t *testing.T) {
		reg := registry.New(registry.Config{})
		svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog()})
		addr := serveAgent(t, svc, "tcp")
		ctx, cancel := context.WithCancel(context.Background())
		const conns = 10
		refused := make([]int, conns)
		var mu sync.Mutex
		var other []error
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for c := range conns {
			cl := dialAgent(t, addr)
			for range streams / conns {
				s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: -1})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.Recv() // returns at once if refused, else when ctx ends
					mu.Lock()
					defer mu.Unlock()
					switch {
					case status.Code(err) == codes.ResourceExhausted:
						refused[c]++
					case ctx.Err() == nil:
						other = append(other, err)
					}
				}()
			}
		}
		testutil.WaitFor(t, 30*time.Second, "256 streams served and the rest refused", func() bool {
			mu.Lock()
			defer mu.Unlock()
			n, _ := svc.Subscribers()
			return n == config.DefaultMaxEventSubscribers && sum(refused) == streams-n
		})
		mu.Lock()
		defer mu.Unlock()
		for c, r := range refused {
			if open := streams/conns - r; open > config.DefaultMaxEventSubscribersPerConn {
				t.Errorf("connection %d holds %d streams, over the per-connection cap %d", c, open, config.DefaultMaxEventSubscribersPerConn)
			}
		}
		if len(other) > 0 {
			t.Errorf("streams ended with %v, want ResourceExhausted or nothing", other)
		}
	})

	t.Run("caps raised", func(t *testing.T) {
		reg, svc, addr, growth := stallSubscribers(t, streams)
		if growth > 64<<20 {
			t.Errorf("agent heap grew by %.1f MiB for %d stalled subscribers, want < 64 MiB", mib(growth), streams)
		}
		// One subscriber that reads, among the 2,000 that do not, gets
		// every event.
		p50, p99 := eventLatency(t, reg, svc, addr)
		t.Logf("event latency: p50 %s, p99 %s", p50, p99)
	})
}

// BenchmarkEventLatencyStalledSubscribers reports how soon a subscriber that
// reads sees each new event while 2,000 others stall in Send (target: p99
// <= 10 ms), beside the same subscriber's latency with no stalled ones, and
// what the stalled streams cost the agent's heap.
func BenchmarkEventLatencyStalledSubscribers(b *testing.B) {
	const streams = 2000
	for b.Loop() {
		reg := registry.New(registry.Config{EventBuffer: 1024})
		svc := newAgentService(b, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog()})
		_, direct := eventLatency(b, reg, svc, serveAgent(b, svc, "tcp"))

		reg, svc, addr, growth := stallSubscribers(b, streams)
		p50, p99 := eventLatency(b, reg, svc, addr)
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50_ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99_ms")
		b.ReportMetric(float64(direct.Microseconds())/1000, "direct_p99_ms")
		b.ReportMetric(mib(growth), "stalled_heap_MiB")
	}
}

// stallSubscribers serves a registry holding a full ring of 1 KiB events to
// n streams of a helper process that never read, with the subscriber caps
// raised to allow them, waits until every stream is blocked in Send, and
// returns the registry, the service, its address and how much the heap grew.
func stallSubscribers(tb testing.TB, n int) (*registry.Registry, *AgentService, string, int64) {
	tb.Helper()
	reg := registry.New(registry.Config{EventBuffer: 1024})
	emit(reg, 1024, 20, 1024)
	svc := newAgentService(tb, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(),
		MaxSubscribers: n + 1, MaxSubscribersPerConn: n + 1})
	addr := serveAgent(tb, svc, "tcp")
	before := heapInUse()

	startHelper(tb, addr, n)
	// Every stream ends blocked in Send; wait until all are in Send and no
	// event went out for 200 ms.
	var lastSent uint64
	stable := 0
	testutil.WaitFor(tb, 60*time.Second, "the streams to stall in Send", func() bool {
		subs, _ := svc.Subscribers()
		sent := svc.sent.Load()
		if subs != n || svc.sending.Load() != int64(n) || sent != lastSent {
			lastSent, stable = sent, 0
			return false
		}
		stable++
		return stable >= 40 // 40 polls of testutil.WaitFor: 200 ms
	})
	growth := heapInUse() - before
	tb.Logf("%d stalled subscribers (%d events sent): agent heap +%.1f MiB, %.1f KiB per subscriber",
		n, svc.sent.Load(), mib(growth), float64(growth)/float64(n)/1024)
	return reg, svc, addr, growth
}

// eventLatency emits 200 events, one every 2 ms, to a new subscriber that
// reads, fails unless it receives all of them, and returns the median and
// the 99th percentile of emit-to-receive time.
func eventLatency(t testing.TB, reg *registry.Registry, svc *AgentService, addr string) (p50, p99 time.Duration) {
	t.Helper()
	const events = 200
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := dialAgent(t, addr).WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: -1})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the reading subscriber to follow", func() bool {
		return svc.caughtUp.Load() == 1
	})
	received := make(chan []time.Duration, 1)
	go func() {
		var lat []time.Duration
		defer func() { received <- lat }()
		for range events {
			e, err := s.Recv()
			if err != nil {
				return
			}
			lat = append(lat, time.Since(e.GetTime().AsTime()))
		}
	}()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for i := range events {
		<-tick.C
		reg.Register("lat", plugin.Instance{Path: "/var/lib/csisupd/plugins/lat/csi.sock", Inode: uint64(1e6 + i)}, nil)
	}
	var lat []time.Duration
	select {
	case lat = <-received:
	case <-time.After(30 * time.Second):
		t.Fatal("reading subscriber got fewer than 200 events in 30s")
	}
	if len(lat) != events {
		t.Fatalf("reading subscriber got %d events, want %d", len(lat), events)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// A plugin directory whose name is not UTF-8 (Linux file names are bytes)
// reaches clients with its invalid bytes written \xNN: Status, ListPlugins
// and the event stream keep working instead of failing to marshal.
func TestInvalidUTF8NamesReachClients(t *testing.T) {
	reg := registry.New(registry.Config{})
	reg.Register("caf\xe9", plugin.Instance{Path: "/plugins/caf\xe9/csi.sock", Inode: 1}, nil)
	reg.SetIgnored([]plugin.Ignored{{Path: "/plugins/\xff\xfe", Reason: "not a socket"}})
	svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), PluginDir: "/plugins"})
	cl := dialAgent(t, serveAgent(t, svc, "tcp"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	st, err := cl.Status(ctx, &csisupdv1.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if got := st.GetIgnored()[0].GetPath(); got != `/plugins/\xff\xfe` {
		t.Errorf("ignored path = %q, want %q", got, `/plugins/\xff\xfe`)
	}
	if got := st.GetPlugins()[0].GetSocket(); got != `/plugins/caf\xe9/csi.sock` {
		t.Errorf("socket = %q", got)
	}
	list, err := cl.ListPlugins(ctx, &csisupdv1.ListPluginsRequest{})
	if err != nil || len(list.GetPlugins()) != 1 || list.GetPlugins()[0].GetId() != `caf\xe9` {
		t.Fatalf("ListPlugins = %v, %v; want plugin caf\\xe9", list, err)
	}
	s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.Recv()
	if err != nil || e.GetPluginId() != `caf\xe9` || !strings.Contains(e.GetDescription(), `caf\xe9`) {
		t.Fatalf("event = %v, %v; want one of caf\\xe9", e, err)
	}
}

// Events encoded once are shared only by streams that encode alike: a
// client whose requests are gzip-compressed (so its responses are too) and
// a plain one, served together in either order, both decode every event.
func TestWatchEventsCompressedAndPlainClients(t *testing.T) {
	for _, order := range [][]bool{{false, true}, {true, false}} {
		t.Run(fmt.Sprintf("gzip first %v", order[0]), func(t *testing.T) {
			reg := registry.New(registry.Config{})
			emit(reg, 50, 5, 60)
			svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog()})
			addr := serveAgent(t, svc, "tcp")
			want := registry.New(registry.Config{}) // the same events, for comparison
			emit(want, 50, 5, 60)
			evs, _ := want.Events(0)
			for _, gz := range order {
				var opts []grpc.DialOption
				if gz {
					opts = append(opts, grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name)))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s, err := dialAgent(t, addr, opts...).WatchEvents(ctx, &csisupdv1.WatchEventsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range evs {
					got, err := s.Recv()
					if err != nil {
						t.Fatalf("gzip %v: event %d: %v", gz, e.Index, err)
					}
					if got.GetIndex() != e.Index || got.GetPluginId() != e.PluginID || got.GetDescription() != e.Description {
						t.Fatalf("gzip %v: got %v, want %+v", gz, got, e)
					}
				}
			}
		})
	}
}
