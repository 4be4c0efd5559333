package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Bounds of what `operator debug` holds in memory for one part: the log
// stream, one profile, one metrics snapshot.
const (
	maxDebugLogBytes     = 32 << 20
	maxDebugProfileBytes = 64 << 20
	maxDebugMetricsBytes = 16 << 20
	// maxDebugCPUProfile is the longest CPU profile the bundle takes.
	maxDebugCPUProfile = 30 * time.Second
)

// debugOptions are the flags of `operator debug`.
type debugOptions struct {
	duration, interval time.Duration
	output             string
}

func newOperatorDebugCommand(opts *clientOptions) *cobra.Command {
	d := debugOptions{}
	cmd := &cobra.Command{
		Use:   "debug",
		Short: "Collect the agent's state, logs, metrics and profiles into a tar.gz for a bug report",
		Long: "Collect, for --duration, what a bug report needs from the agent at --address into\n" +
			"csisupd-debug-<UTC time>.tar.gz in --output: its status, events, configuration (secrets\n" +
			"redacted), metrics every --interval, CPU, heap and goroutine profiles, its log stream at\n" +
			"debug level, and, from a server, the cluster's plugins, nodes, volumes and raft peers.\n" +
			"A part that cannot be collected is recorded in manifest.json and the rest goes on.\n" +
			"Profiles need a token with agent:write, or enable_debug = true on an agent without ACLs.\n" +
			"An interrupt ends the collection early and still writes the archive.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if d.duration <= 0 {
				return usageError{fmt.Errorf("--duration %s: want a positive duration", d.duration)}
			}
			if d.interval <= 0 {
				return usageError{fmt.Errorf("--interval %s: want a positive duration", d.interval)}
			}
			conn, err := opts.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			started := time.Now().UTC()
			fmt.Fprintf(cmd.ErrOrStderr(), "Collecting from the agent at %s for %s...\n", display(opts.address), d.duration)
			b := collectDebug(ctx, stop, opts, d, conn, started)
			if len(b.files) == 0 {
				return fmt.Errorf("nothing could be collected from the agent at %s: %s", display(opts.address), b.manifest.GetErrors()[0].GetError())
			}
			path, err := b.write(d.output, started)
			if err != nil {
				return err
			}
			for _, e := range b.manifest.GetErrors() {
				fmt.Fprintf(cmd.ErrOrStderr(), "Not collected: %s: %s\n", e.GetPart(), displayLines(e.GetError()))
			}
			if opts.json {
				return printProto(cmd.OutOrStdout(), &csisupdv1.DebugResult{File: path, Manifest: b.manifest})
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), display(path))
			return err
		},
	}
	cmd.Flags().DurationVar(&d.duration, "duration", 30*time.Second, "how long to collect the log stream and metrics (the CPU profile runs for up to 30s of it)")
	cmd.Flags().DurationVar(&d.interval, "interval", 10*time.Second, "time between two metrics snapshots")
	cmd.Flags().StringVar(&d.output, "output", ".", "directory to write the archive to")
	return cmd
}

// debugBundle is what `operator debug` collected: files by path in the
// archive, and the manifest. Parts are collected concurrently.
type debugBundle struct {
	mu       sync.Mutex
	files    map[string][]byte
	manifest *csisupdv1.DebugManifest
}

// add records file name.
func (b *debugBundle) add(name string, data []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.files[name] = data
}

// fail records that part could not be collected.
func (b *debugBundle) fail(part string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.manifest.Errors = append(b.manifest.Errors, &csisupdv1.DebugError{Part: part, Error: err.Error()})
}

// part records file name with what collect returns: the data, or the
// error. Data returned with an error is kept too (a log stream cut short).
func (b *debugBundle) part(name string, collect func() ([]byte, error)) {
	data, err := collect()
	if err != nil {
		b.fail(name, err)
	}
	if err == nil || len(data) > 0 {
		b.add(name, data)
	}
}

// collectDebug collects the bundle from the agent on conn. ctx ends the
// timed parts early (an interrupt); stop is called when they are done, so
// that a second interrupt ends the command. Every call has its own
// deadline (--timeout) and none is cut by ctx, so the final snapshots are
// taken after an interrupt too.
func collectDebug(ctx context.Context, stop func(), o *clientOptions, d debugOptions, conn grpc.ClientConnInterface, started time.Time) *debugBundle {
	b := &debugBundle{files: map[string][]byte{}, manifest: &csisupdv1.DebugManifest{
		Version: currentBuild().Version, Address: o.address, StartedAt: timestamppb.New(started),
		Duration: d.duration.String(), Interval: d.interval.String(),
	}}
	agent := csisupdv1.NewAgentClient(conn)
	control := csisupdv1.NewControlClient(conn)
	addr := o.address
	// unary runs one call with --timeout.
	unary := func(name string, call func(context.Context) (proto.Message, error), wrap func(string, error) error) {
		b.part(name, func() ([]byte, error) {
			rctx, cancel := o.requestContext(context.Background())
			defer cancel()
			msg, err := call(rctx)
			if err != nil {
				return nil, wrap(addr, err)
			}
			var buf bytes.Buffer
			err = printProto(&buf, msg)
			return buf.Bytes(), err
		})
	}
	metrics := func(n int) {
		b.part(fmt.Sprintf("agent/metrics/%04d.prom", n), func() ([]byte, error) {
			rctx, cancel := o.requestContext(context.Background())
			defer cancel()
			resp, err := agent.Metrics(rctx, &csisupdv1.MetricsRequest{}, grpc.MaxCallRecvMsgSize(maxDebugMetricsBytes))
			if err != nil {
				return nil, agentError(addr, err)
			}
			return resp.GetText(), nil
		})
	}
	// profile runs one Profile call with --timeout plus extra, within
	// parent.
	profile := func(parent context.Context, name string, req *csisupdv1.ProfileRequest, extra time.Duration) {
		b.part(name, func() ([]byte, error) {
			rctx, cancel := context.WithTimeout(parent, o.timeout+extra)
			defer cancel()
			return readProfile(rctx, agent, addr, req)
		})
	}

	// At the start.
	unary("agent/status.json", func(ctx context.Context) (proto.Message, error) {
		return agent.Status(ctx, &csisupdv1.StatusRequest{})
	}, agentError)
	b.part("agent/events.json", func() ([]byte, error) {
		rctx, cancel := o.requestContext(context.Background())
		defer cancel()
		return readEvents(rctx, agent, addr)
	})
	b.part("agent/config.hcl", func() ([]byte, error) {
		rctx, cancel := o.requestContext(context.Background())
		defer cancel()
		resp, err := agent.Config(rctx, &csisupdv1.ConfigRequest{})
		if err != nil {
			return nil, agentError(addr, err)
		}
		return []byte(resp.GetHcl()), nil
	})
	metrics(0)

	// For the duration: the log stream, the CPU profile, and metrics at
	// every interval.
	timed, cancel := context.WithTimeout(ctx, d.duration)
	defer cancel()
	cpu := min(d.duration, maxDebugCPUProfile)
	seconds := max(1, uint32(cpu/time.Second))
	snapshots := 1
	var wg sync.WaitGroup
	// The log stream ends by cancellation, not by a deadline: a deadline
	// travels to the agent, which may end the stream with RST_STREAM a
	// moment before this side sees its own deadline pass.
	logs, stopLogs := context.WithCancel(ctx)
	defer stopLogs()
	context.AfterFunc(timed, stopLogs)
	wg.Go(func() {
		b.part("agent/monitor.log", func() ([]byte, error) {
			return monitorLog(logs, agent, addr, "debug", maxDebugLogBytes)
		})
	})
	wg.Go(func() {
		profile(ctx, "agent/pprof/cpu.prof", &csisupdv1.ProfileRequest{Profile: "cpu", Seconds: seconds}, time.Duration(seconds)*time.Second)
	})
	wg.Go(func() {
		ticker := time.NewTicker(d.interval)
		defer ticker.Stop()
		for {
			select {
			case <-timed.Done():
				return
			case <-ticker.C:
				metrics(snapshots)
				snapshots++
			}
		}
	})
	wg.Wait()
	stop()

	// At the end.
	metrics(snapshots)
	profile(context.Background(), "agent/pprof/heap.prof", &csisupdv1.ProfileRequest{Profile: "heap"}, 0)
	profile(context.Background(), "agent/pprof/goroutine.txt", &csisupdv1.ProfileRequest{Profile: "goroutine", Debug: 2}, 0)
	unary("cluster/plugins.json", func(ctx context.Context) (proto.Message, error) {
		return control.ListPlugins(ctx, &csisupdv1.PluginListRequest{})
	}, controlError)
	unary("cluster/nodes.json", func(ctx context.Context) (proto.Message, error) {
		return control.ListNodes(ctx, &csisupdv1.NodeListRequest{})
	}, controlError)
	unary("cluster/volumes.json", func(ctx context.Context) (proto.Message, error) {
		return control.ListVolumes(ctx, &csisupdv1.VolumeListRequest{})
	}, controlError)
	unary("cluster/raft-peers.json", func(ctx context.Context) (proto.Message, error) {
		return control.RaftPeers(ctx, &csisupdv1.RaftPeersRequest{})
	}, controlError)

	b.manifest.Files = slices.Sorted(maps.Keys(b.files))
	return b
}

// readEvents returns the agent's buffered events, without following, as
// one JSON array of the objects `events --json` prints.
func readEvents(ctx context.Context, cl csisupdv1.AgentClient, addr string) ([]byte, error) {
	stream, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{NoFollow: true})
	if err != nil {
		return nil, agentError(addr, err)
	}
	var buf bytes.Buffer
	buf.WriteString("[")
	for n := 0; ; n++ {
		e, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, eventsError(addr, err)
		}
		if n > 0 {
			buf.WriteString(",")
		}
		buf.WriteString("\n  ")
		if err := printProtoLine(&buf, e); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1) // printProtoLine's newline
	}
	buf.WriteString("\n]\n")
	return buf.Bytes(), nil
}

// readProfile returns the profile req asks for.
func readProfile(ctx context.Context, cl csisupdv1.AgentClient, addr string, req *csisupdv1.ProfileRequest) ([]byte, error) {
	stream, err := cl.Profile(ctx, req)
	if err != nil {
		return nil, agentError(addr, err)
	}
	var buf bytes.Buffer
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, agentError(addr, err)
		}
		if buf.Len()+len(chunk.GetData()) > maxDebugProfileBytes {
			return nil, fmt.Errorf("the %s profile is larger than %d MiB", req.GetProfile(), maxDebugProfileBytes>>20)
		}
		buf.Write(chunk.GetData())
	}
}

// write writes the archive csisupd-debug-<started>.tar.gz into dir and
// returns its path. It holds one directory of that name, with
// manifest.json and the files of the manifest, each with mode 0600, as
// the archive itself. A failed write leaves no file.
func (b *debugBundle) write(dir string, started time.Time) (path string, err error) {
	base := "csisupd-debug-" + started.Format("20060102T150405Z")
	path = filepath.Join(dir, base+".tar.gz")
	var manifest bytes.Buffer
	if err := printProto(&manifest, b.manifest); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("debug archive: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	now := time.Now()
	entry := func(name string, data []byte) error {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: base + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: now}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := entry("manifest.json", manifest.Bytes()); err != nil {
		return "", fmt.Errorf("debug archive %s: %w", path, err)
	}
	for _, name := range b.manifest.GetFiles() {
		if err := entry(name, b.files[name]); err != nil {
			return "", fmt.Errorf("debug archive %s: %w", path, err)
		}
	}
	for _, step := range []func() error{tw.Close, gz.Close, f.Sync, f.Close} {
		if err := step(); err != nil {
			return "", fmt.Errorf("debug archive %s: %w", path, err)
		}
	}
	return path, nil
}
