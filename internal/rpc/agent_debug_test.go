package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// debugAgent serves an Agent service over an empty registry with cfg's
// debugging fields, and returns it with a client.
func debugAgent(t *testing.T, cfg AgentServiceConfig, opts ...grpc.DialOption) (*AgentService, csisupdv1.AgentClient) {
	t.Helper()
	reg := registry.New(registry.Config{})
	cfg.Plugins, cfg.Events = reg.Source(), reg.EventLog()
	svc := newAgentService(t, cfg)
	return svc, dialAgent(t, serveAgent(t, svc, "tcp"), opts...)
}

// agentLogger is an agent's root logger at info, writing to out.
func agentLogger(out io.Writer) hclog.InterceptLogger {
	return hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "csisupd", Level: hclog.Info, Output: out})
}

// A monitor receives lines at its own level, above or below the agent's,
// and the agent keeps logging at its level.
func TestMonitorLevelIsTheStreams(t *testing.T) {
	tests := []struct {
		name  string
		level string
		json  bool
		// log logs the lines; the monitor's first message must hold want
		// and not skip.
		log        func(l hclog.Logger)
		want, skip string
	}{
		{"debug under an info agent", "debug", false, func(l hclog.Logger) {
			l.Debug("a debug line for the monitor", "k", "v")
		}, "[DEBUG] csisupd.registry: a debug line for the monitor: k=v", ""},
		{"json", "trace", true, func(l hclog.Logger) {
			l.Trace("a trace line for the monitor")
		}, `"@level":"trace"`, ""},
		{"warn skips info", "warn", false, func(l hclog.Logger) {
			l.Info("an info line")
			l.Warn("a warn line")
		}, "[WARN]  csisupd.registry: a warn line", "an info line"},
		{"empty level is info", "", false, func(l hclog.Logger) {
			l.Debug("a debug line")
			l.Info("an info line")
		}, "[INFO]  csisupd.registry: an info line", "a debug line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var agentOut testutil.SyncBuffer
			logger := agentLogger(&agentOut)
			svc, cl := debugAgent(t, AgentServiceConfig{Logs: logger})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: tt.level, Json: tt.json})
			if err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 10*time.Second, "the monitor's sink", func() bool { return svc.Monitors() == 1 })
			tt.log(logger.Named("registry"))
			resp, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			got := string(resp.GetData())
			if !strings.Contains(got, tt.want) || (tt.skip != "" && strings.Contains(got, tt.skip)) {
				t.Fatalf("monitor at %q got %q, want %q without %q", tt.level, got, tt.want, tt.skip)
			}
			if tt.json {
				var line map[string]any
				if err := json.Unmarshal(bytes.TrimSpace(resp.GetData()), &line); err != nil || line["@message"] != "a trace line for the monitor" {
					t.Errorf("JSON line %q: %v, %v", got, line, err)
				}
			}
			if logger.GetLevel() != hclog.Info {
				t.Errorf("the agent's level is %s after a monitor, want info", logger.GetLevel())
			}
			if own := agentOut.String(); strings.Contains(own, "for the monitor") || strings.Contains(own, "a debug line") {
				t.Errorf("the agent logged below its level:\n%s", own)
			}
		})
	}
}

func TestMonitorRefusals(t *testing.T) {
	tests := []struct {
		name  string
		cfg   AgentServiceConfig
		level string
		code  codes.Code
		msg   string
	}{
		{"unknown level", AgentServiceConfig{Logs: agentLogger(io.Discard)}, "verbose", codes.InvalidArgument, `log_level: "verbose" is not one of`},
		{"no intercept logger", AgentServiceConfig{}, "debug", codes.FailedPrecondition, "cannot be monitored"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cl := debugAgent(t, tt.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: tt.level})
			if err == nil {
				_, err = s.Recv()
			}
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("Monitor: %v, want %s with %q", err, tt.code, tt.msg)
			}
		})
	}
}

// Monitor validates levels against the list it is given, and needs one.
func TestMonitorLogLevels(t *testing.T) {
	_, cl := debugAgent(t, AgentServiceConfig{Logs: agentLogger(io.Discard), LogLevels: []string{"info", "error"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: "debug"})
	if err == nil {
		_, err = s.Recv()
	}
	if want := `log_level: "debug" is not one of info, error`; status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
		t.Errorf("Monitor at a level not listed: %v, want InvalidArgument %q", err, want)
	}

	reg := registry.New(registry.Config{})
	_, err = NewAgentService(AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), Logs: agentLogger(io.Discard),
		MaxSubscribers: config.DefaultMaxEventSubscribers, MaxSubscribersPerConn: config.DefaultMaxEventSubscribersPerConn})
	if err == nil || !strings.Contains(err.Error(), "LogLevels is required with Logs") {
		t.Errorf("NewAgentService with Logs and no LogLevels: %v, want an error naming LogLevels", err)
	}
}

// A client that does not read never blocks the logger: lines beyond the
// stream's buffer are dropped and counted, and once the client reads it
// gets every kept line and a warning with the number dropped, so that the
// two add up to what was logged.
func TestMonitorSlowClientDropsWithoutBlocking(t *testing.T) {
	logger := agentLogger(io.Discard)
	// A fixed window of 64 KiB (no BDP growth), so that what the
	// transport takes while the client does not read stays small.
	svc, cl := debugAgent(t, AgentServiceConfig{Logs: logger},
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: "debug"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the monitor's sink", func() bool { return svc.Monitors() == 1 })

	// 5,000 lines of 1 KiB: five times the stream's buffer, far more
	// than the transport holds.
	const lines = 5000
	filler := strings.Repeat("x", 1000)
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for i := range lines {
			logger.Debug("filler", "i", i, "pad", filler)
		}
	}()
	select {
	case <-logged:
	case <-ctx.Done():
		t.Fatal("the logger blocked on a monitor whose client does not read")
	}

	dropped := regexp.MustCompile(`\[WARN\]  monitor: dropped (\d+) log lines \(client too slow\)`)
	got, lost := 0, 0
	for got+lost < lines {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("after %d lines and %d dropped: %v", got, lost, err)
		}
		got += strings.Count(string(resp.GetData()), "filler: i=")
		for _, m := range dropped.FindAllStringSubmatch(string(resp.GetData()), -1) {
			n, _ := strconv.Atoi(m[1])
			lost += n
		}
	}
	if got+lost != lines || lost == 0 {
		t.Fatalf("received %d lines and %d dropped, want %d in all with some dropped", got, lost, lines)
	}
}

// At most MaxMonitors streams are served at once; a closed one frees its
// slot and its sink.
func TestMonitorCap(t *testing.T) {
	svc, cl := debugAgent(t, AgentServiceConfig{Logs: agentLogger(io.Discard)})
	open := func() (context.CancelFunc, grpc.ServerStreamingClient[csisupdv1.MonitorResponse]) {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: "info"})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		return cancel, s
	}
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for range MaxMonitors {
		c, _ := open()
		cancels = append(cancels, c)
	}
	testutil.WaitFor(t, 10*time.Second, "every monitor's sink", func() bool { return svc.Monitors() == MaxMonitors })
	c, s := open()
	_, err := s.Recv()
	c()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("monitor %d: %v, want ResourceExhausted", MaxMonitors+1, err)
	}
	cancels[0]()
	testutil.WaitFor(t, 10*time.Second, "a closed monitor's sink removed", func() bool { return svc.Monitors() == MaxMonitors-1 })
	c, _ = open()
	cancels[0] = c
	testutil.WaitFor(t, 10*time.Second, "a monitor in the freed slot", func() bool { return svc.Monitors() == MaxMonitors })
	for _, c := range cancels {
		c()
	}
	testutil.WaitFor(t, 10*time.Second, "every sink removed", func() bool { return svc.Monitors() == 0 })
}

// readProfile returns the whole profile of one Profile call, or its error.
func readProfile(t *testing.T, cl csisupdv1.AgentClient, req *csisupdv1.ProfileRequest) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := cl.Profile(ctx, req)
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		chunk, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		if len(chunk.GetData()) > profileChunkSize {
			t.Errorf("a chunk of %d bytes", len(chunk.GetData()))
		}
		out = append(out, chunk.GetData()...)
	}
}

// With ACLs off, profiles are served only with enable_debug; with ACLs on
// the Authorizer decides (agent:write), and the service serves.
func TestProfileAccess(t *testing.T) {
	on, off := func() bool { return true }, func() bool { return false }
	tests := []struct {
		name  string
		acl   bool
		debug func() bool
		want  codes.Code
	}{
		{"acl off, debug off", false, off, codes.PermissionDenied},
		{"acl off, debug unset", false, nil, codes.PermissionDenied},
		{"acl off, debug on", false, on, codes.OK},
		{"acl on", true, off, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, cl := debugAgent(t, AgentServiceConfig{ACL: tt.acl, EnableDebug: tt.debug})
			data, err := readProfile(t, cl, &csisupdv1.ProfileRequest{Profile: "goroutine", Debug: 2})
			if status.Code(err) != tt.want {
				t.Fatalf("Profile: %v, want %s", err, tt.want)
			}
			if tt.want == codes.PermissionDenied && status.Convert(err).Message() != profilingOff {
				t.Errorf("refusal %q, want %q", status.Convert(err).Message(), profilingOff)
			}
			if tt.want == codes.OK && !strings.Contains(string(data), "goroutine ") {
				t.Errorf("goroutine profile is not the stacks: %.200q", data)
			}
		})
	}
}

func TestProfiles(t *testing.T) {
	on := func() bool { return true }
	_, cl := debugAgent(t, AgentServiceConfig{EnableDebug: on})
	gzipped := func(b []byte) bool { return len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b }
	for _, name := range []string{"heap", "allocs", "goroutine", "threadcreate", "block", "mutex"} {
		data, err := readProfile(t, cl, &csisupdv1.ProfileRequest{Profile: name})
		if err != nil || !gzipped(data) {
			t.Errorf("%s profile: %d bytes (%.8x), %v; want a gzipped protobuf", name, len(data), data, err)
		}
	}
	data, err := readProfile(t, cl, &csisupdv1.ProfileRequest{Profile: "cpu", Seconds: 1})
	if err != nil || !gzipped(data) {
		t.Fatalf("cpu profile: %d bytes, %v; want a gzipped protobuf", len(data), err)
	}

	invalid := []struct {
		req  *csisupdv1.ProfileRequest
		want string
	}{
		{&csisupdv1.ProfileRequest{Profile: "cpu"}, "seconds: 0 is not between 1 and 60"},
		{&csisupdv1.ProfileRequest{Profile: "cpu", Seconds: 61}, "seconds: 61 is not between 1 and 60"},
		{&csisupdv1.ProfileRequest{Profile: "trace"}, `profile: "trace" is not one of cpu, heap`},
		{&csisupdv1.ProfileRequest{Profile: "heap", Debug: 2}, "debug: 2 is not 0 (protobuf) or 1 (text)"},
		{&csisupdv1.ProfileRequest{Profile: "goroutine", Debug: 3}, "debug: 3 is not 0 (protobuf), 1 (text) or 2 (stacks)"},
	}
	for _, tt := range invalid {
		_, err := readProfile(t, cl, tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("%v: %v, want InvalidArgument with %q", tt.req, err, tt.want)
		}
	}
}

// One CPU profile at a time: a second one through the service, or one
// while something else in the process profiles, is FailedPrecondition.
func TestProfileCPUOneAtATime(t *testing.T) {
	svc, cl := debugAgent(t, AgentServiceConfig{EnableDebug: func() bool { return true }})
	req := &csisupdv1.ProfileRequest{Profile: "cpu", Seconds: 1}

	svc.cpuProfiling.Lock() // as a running Profile holds it
	_, err := readProfile(t, cl, req)
	svc.cpuProfiling.Unlock()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "running already") {
		t.Fatalf("cpu profile while another runs: %v, want FailedPrecondition", err)
	}

	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatal(err)
	}
	_, err = readProfile(t, cl, req)
	pprof.StopCPUProfile()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "start CPU profile") {
		t.Fatalf("cpu profile while the process profiles: %v, want FailedPrecondition", err)
	}
}

// brokenCollector fails every collection.
type brokenCollector struct{ desc *prometheus.Desc }

func (c brokenCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c brokenCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(c.desc, errors.New("broken on purpose"))
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "csisupd_test_things_total", Help: "Things."})
	reg.MustRegister(c, brokenCollector{prometheus.NewDesc("csisupd_test_broken", "Broken.", nil, nil)})
	c.Add(3)
	_, cl := debugAgent(t, AgentServiceConfig{Gatherer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Metrics(ctx, &csisupdv1.MetricsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// A broken collector leaves its metrics out; the others are there.
	text := string(resp.GetText())
	for _, want := range []string{"# TYPE csisupd_test_things_total counter\n", "csisupd_test_things_total 3\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "csisupd_test_broken") {
		t.Errorf("metrics hold the broken collector:\n%s", text)
	}

	_, cl = debugAgent(t, AgentServiceConfig{})
	if _, err := cl.Metrics(ctx, &csisupdv1.MetricsRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Metrics without a registry: %v, want FailedPrecondition", err)
	}
}

// Config returns the configuration with every secret redacted.
func TestConfigIsRedacted(t *testing.T) {
	const consulToken, agentToken = "c0nsul-s3cret-9f1e", "ag3nt-s3cret-77d2"
	cfg := config.Default()
	cfg.Name = "node-1"
	cfg.Consul.Token = consulToken
	cfg.ACL.AgentToken = agentToken
	cfg.EnableDebug = true
	_, cl := debugAgent(t, AgentServiceConfig{Config: cfg.String})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cl.Config(ctx, &csisupdv1.ConfigRequest{})
	if err != nil {
		t.Fatal(err)
	}
	hcl := resp.GetHcl()
	for _, secret := range []string{consulToken, agentToken} {
		if strings.Contains(hcl, secret) {
			t.Errorf("Config shows a secret:\n%s", hcl)
		}
	}
	for _, want := range []string{"name = \"node-1\"\n", "enable_debug = true\n", "  token = \"[redacted]\"\n", "    agent = \"[redacted]\"\n"} {
		if !strings.Contains(hcl, want) {
			t.Errorf("Config lacks %q:\n%s", want, hcl)
		}
	}
}

// no_follow sends what is buffered, then ends the stream.
func TestWatchEventsNoFollow(t *testing.T) {
	tests := []struct {
		name string
		req  *csisupdv1.WatchEventsRequest
		want []uint64
	}{
		{"all", &csisupdv1.WatchEventsRequest{NoFollow: true}, span(1, 20)},
		{"last 3", &csisupdv1.WatchEventsRequest{NoFollow: true, Replay: 3}, span(18, 20)},
		{"none", &csisupdv1.WatchEventsRequest{NoFollow: true, Replay: -1}, nil},
		{"one plugin", &csisupdv1.WatchEventsRequest{NoFollow: true, PluginId: "p2"}, []uint64{3, 8, 13, 18}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := registry.New(registry.Config{})
			emit(reg, 20, 5, 10)
			svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog()})
			cl := dialAgent(t, serveAgent(t, svc, "tcp"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := cl.WatchEvents(ctx, tt.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []uint64
			for {
				e, err := s.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got = append(got, e.GetIndex())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("indexes %v, want %v", got, tt.want)
			}
		})
	}
}
