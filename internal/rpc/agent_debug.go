package rpc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// The Agent API's debugging methods: Monitor, Profile, Metrics and Config.

// LogSinks is what Monitor needs of the agent's logger: an
// hclog.InterceptLogger is one. Every line logged through it, or through a
// logger derived from it (Named, With), also goes to each registered sink,
// at the sink's own level.
type LogSinks interface {
	RegisterSink(sink hclog.SinkAdapter)
	DeregisterSink(sink hclog.SinkAdapter)
}

// MaxMonitors caps the Monitor streams one agent serves at a time; one
// beyond it ends at once with ResourceExhausted. Each holds a log buffer
// of up to monitorMaxBytes.
const MaxMonitors = 8

// The buffer of one Monitor stream: lines logged while the stream is
// sending wait here, up to monitorMaxLines lines or monitorMaxBytes bytes;
// more are dropped and counted. The logger never waits for a stream.
const (
	monitorMaxLines = 512
	monitorMaxBytes = 1 << 20
)

// profileChunkSize is the largest ProfileChunk.
const profileChunkSize = 1 << 20

// maxCPUProfileSeconds is the longest CPU profile Profile takes.
const maxCPUProfileSeconds = 60

// profilingOff is Profile's refusal with ACLs off and enable_debug unset.
const profilingOff = "profiling is off: set enable_debug = true, or enable ACLs and use a token with agent:write"

// Monitors returns the number of Monitor streams whose sink is registered
// with the agent's logger.
func (a *AgentService) Monitors() int { return int(a.monitoring.Load()) }

// Monitor streams the agent's log lines at the request's level until the
// caller goes away, without changing the level the agent logs at: each
// stream is a sink of the agent's InterceptLogger with a level of its own.
//
// The sink writes into a bounded buffer and never blocks the logger. When
// the caller does not read fast enough the buffer fills, further lines are
// dropped, and once the stream has sent what was buffered it sends the
// line "[WARN] monitor: dropped N log lines (client too slow)" (or its
// JSON form). The sink is removed when the stream ends. Streams beyond
// MaxMonitors end at once with ResourceExhausted; an unknown level is
// InvalidArgument.
func (a *AgentService) Monitor(req *csisupdv1.MonitorRequest, out grpc.ServerStreamingServer[csisupdv1.MonitorResponse]) error {
	if a.cfg.Logs == nil {
		return status.Error(codes.FailedPrecondition, "this agent's logger cannot be monitored")
	}
	level, err := monitorLevel(req.GetLogLevel(), a.cfg.LogLevels)
	if err != nil {
		return err
	}
	if n := a.monitors.Add(1); n > MaxMonitors {
		a.monitors.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "%d monitor streams are open, the most one agent serves at a time", MaxMonitors)
	}
	defer a.monitors.Add(-1)

	buf := newLogBuffer(monitorMaxLines, monitorMaxBytes)
	sink := hclog.NewSinkAdapter(&hclog.LoggerOptions{
		Level:      level,
		JSONFormat: req.GetJson(),
		Output:     buf,
	})
	a.cfg.Logs.RegisterSink(sink)
	a.monitoring.Add(1)
	defer func() {
		a.cfg.Logs.DeregisterSink(sink)
		a.monitoring.Add(-1)
	}()

	ctx := out.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-buf.ready:
		}
		data, dropped := buf.take()
		if dropped > 0 {
			data = append(data, droppedLine(dropped, req.GetJson())...)
		}
		if len(data) == 0 {
			continue
		}
		if err := out.Send(&csisupdv1.MonitorResponse{Data: data}); err != nil {
			return err
		}
	}
}

// monitorLevel parses MonitorRequest.log_level: one of levels, the levels
// the configuration's log_level takes, empty for info.
func monitorLevel(s string, levels []string) (hclog.Level, error) {
	switch {
	case s == "":
		return hclog.Info, nil
	case slices.Contains(levels, s):
		return hclog.LevelFromString(s), nil
	}
	return hclog.NoLevel, status.Errorf(codes.InvalidArgument, "log_level: %q is not one of %s",
		plugin.WireString(s), strings.Join(levels, ", "))
}

// droppedLine is the log line that tells a Monitor stream how many lines
// it lost, formatted as its other lines are.
func droppedLine(n int, json bool) []byte {
	var b bytes.Buffer
	hclog.New(&hclog.LoggerOptions{Name: "monitor", Level: hclog.Warn, JSONFormat: json, Output: &b}).
		Warn(fmt.Sprintf("dropped %d log lines (client too slow)", n))
	return b.Bytes()
}

// logBuffer is the bounded buffer between a Monitor sink and its stream.
// hclog writes each line with one Write, under the InterceptLogger's lock:
// Write only appends or counts, it never waits.
type logBuffer struct {
	maxLines, maxBytes int
	// ready holds a token when there is something to take.
	ready chan struct{}

	mu      sync.Mutex
	data    []byte
	lines   int
	dropped int
}

func newLogBuffer(maxLines, maxBytes int) *logBuffer {
	return &logBuffer{maxLines: maxLines, maxBytes: maxBytes, ready: make(chan struct{}, 1)}
}

// Write appends one log line, or counts it as dropped when the buffer is
// full. It never fails: a failing sink would make hclog report the error
// on the agent's own output.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	if b.lines >= b.maxLines || len(b.data)+len(p) > b.maxBytes {
		b.dropped++
	} else {
		b.data = append(b.data, p...) // hclog reuses p
		b.lines++
	}
	b.mu.Unlock()
	select {
	case b.ready <- struct{}{}:
	default:
	}
	return len(p), nil
}

// take returns the buffered lines and the number dropped since the last
// take, and empties the buffer.
func (b *logBuffer) take() (data []byte, dropped int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	data, dropped = b.data, b.dropped
	b.data, b.lines, b.dropped = nil, 0, 0
	return data, dropped
}

// Profile takes the runtime profile the request names and streams it in
// chunks of at most 1 MiB.
//
// With ACLs on, the Authorizer has checked agent:write. With ACLs off the
// agent profiles only when enable_debug is set, else PermissionDenied: a
// profile costs CPU and shows the agent's memory. A cpu profile runs for
// the request's seconds (1 to 60), one at a time per process
// (FailedPrecondition while another runs, also one taken through
// /debug/pprof/); the other profiles are snapshots written with the
// request's debug argument (runtime/pprof). The block and mutex profiles
// are empty: the agent does not turn their sampling on.
func (a *AgentService) Profile(req *csisupdv1.ProfileRequest, out grpc.ServerStreamingServer[csisupdv1.ProfileChunk]) error {
	if !a.cfg.ACL && (a.cfg.EnableDebug == nil || !a.cfg.EnableDebug()) {
		return status.Error(codes.PermissionDenied, profilingOff)
	}
	var buf bytes.Buffer
	switch name := req.GetProfile(); name {
	case "cpu":
		if err := a.cpuProfile(out.Context(), &buf, req.GetSeconds()); err != nil {
			return err
		}
	case "heap", "goroutine", "allocs", "block", "mutex", "threadcreate":
		debug := req.GetDebug()
		if debug > 2 || (debug == 2 && name != "goroutine") {
			want := "0 (protobuf) or 1 (text)"
			if name == "goroutine" {
				want = "0 (protobuf), 1 (text) or 2 (stacks)"
			}
			return status.Errorf(codes.InvalidArgument, "debug: %d is not %s for the %s profile", debug, want, name)
		}
		p := pprof.Lookup(name)
		if p == nil {
			return status.Errorf(codes.Internal, "the Go runtime has no %s profile", name)
		}
		if err := p.WriteTo(&buf, int(debug)); err != nil {
			return status.Errorf(codes.Internal, "write %s profile: %v", name, err)
		}
	default:
		return status.Errorf(codes.InvalidArgument, "profile: %q is not one of cpu, heap, goroutine, allocs, block, mutex, threadcreate",
			plugin.WireString(name))
	}
	for data := buf.Bytes(); len(data) > 0; {
		n := min(len(data), profileChunkSize)
		if err := out.Send(&csisupdv1.ProfileChunk{Data: data[:n]}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// cpuProfile writes a CPU profile of seconds to w. The caller's going
// away stops it early, and then nothing is sent.
func (a *AgentService) cpuProfile(ctx context.Context, w io.Writer, seconds uint32) error {
	if seconds < 1 || seconds > maxCPUProfileSeconds {
		return status.Errorf(codes.InvalidArgument, "seconds: %d is not between 1 and %d (a cpu profile needs its duration)", seconds, maxCPUProfileSeconds)
	}
	if !a.cpuProfiling.TryLock() {
		return status.Error(codes.FailedPrecondition, "a CPU profile of this agent is running already; try again when it ends")
	}
	defer a.cpuProfiling.Unlock()
	// The runtime takes one CPU profile per process: one started through
	// /debug/pprof/profile fails this one.
	if err := pprof.StartCPUProfile(w); err != nil {
		return status.Errorf(codes.FailedPrecondition, "start CPU profile: %v", err)
	}
	timer := time.NewTimer(time.Duration(seconds) * time.Second)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		pprof.StopCPUProfile()
		return status.FromContextError(ctx.Err()).Err()
	case <-timer.C:
	}
	pprof.StopCPUProfile()
	return nil
}

// Metrics returns the agent's registry in the Prometheus text format, as
// /metrics serves it. A collector that fails leaves its metrics out; the
// call fails only when nothing could be gathered.
func (a *AgentService) Metrics(context.Context, *csisupdv1.MetricsRequest) (*csisupdv1.MetricsResponse, error) {
	if a.cfg.Gatherer == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent has no metrics registry")
	}
	families, gatherErr := a.cfg.Gatherer.Gather()
	if gatherErr != nil && len(families) == 0 {
		return nil, status.Errorf(codes.Internal, "gather metrics: %v", gatherErr)
	}
	if gatherErr != nil {
		a.log.Warn("metrics: some collectors failed; returning the rest", "error", gatherErr)
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range families {
		if err := enc.Encode(mf); err != nil {
			return nil, status.Errorf(codes.Internal, "encode metric %s: %v", mf.GetName(), err)
		}
	}
	return &csisupdv1.MetricsResponse{Text: b.Bytes()}, nil
}

// Config returns the effective configuration with its secrets redacted,
// as config.Config renders it.
func (a *AgentService) Config(context.Context, *csisupdv1.ConfigRequest) (*csisupdv1.ConfigResponse, error) {
	if a.cfg.Config == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent does not report its configuration")
	}
	return &csisupdv1.ConfigResponse{Hcl: plugin.WireString(a.cfg.Config())}, nil
}
