package csiclient

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc"
)

// benchPluginEnv, when set, makes the test binary a plugin serving on the
// socket it names until its standard input closes: the benchmark measures
// the client's memory, which a plugin in the same process would blur.
const benchPluginEnv = "CSICLIENT_BENCH_PLUGIN"

// servePluginProcess is the test binary's life as a benchmark plugin.
func servePluginProcess(socket string) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		os.Exit(2)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identityServer{name: "bench.example.com"})
	go func() { _ = srv.Serve(l) }()
	_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark lets go
	srv.Stop()
}

// startPluginProcess runs a plugin in a child process on socket.
func startPluginProcess(b *testing.B, socket string) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), benchPluginEnv+"="+socket)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	testutil.WaitFor(b, 10*time.Second, "the plugin process to listen", func() bool {
		c, err := net.Dial("unix", socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// BenchmarkIdleConnections opens 1,000 connections to one plugin, each
// used for one call and then idle, and reports what each costs the agent:
// heap, goroutine stacks and goroutines. "supervision" is the supervision
// connection; "grpc-go" the full connection, for comparison.
func BenchmarkIdleConnections(b *testing.B) {
	const n = 1000
	kinds := []struct {
		name string
		call func(ctx context.Context, c *Client) error
	}{
		{"supervision", func(ctx context.Context, c *Client) error {
			_, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			return err
		}},
		{"grpc-go", func(ctx context.Context, c *Client) error {
			_, err := c.Identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			return err
		}},
	}
	for _, kind := range kinds {
		b.Run(kind.name, func(b *testing.B) {
			sock := filepath.Join(testutil.TempDir(b), "csi.sock")
			startPluginProcess(b, sock)
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				goroutines := runtime.NumGoroutine()

				clients := make([]*Client, n)
				for i := range clients {
					c, err := New(Config{Socket: sock, Redial: testRedial})
					if err != nil {
						b.Fatal(err)
					}
					clients[i] = c
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err = kind.call(ctx, c)
					cancel()
					if err != nil {
						b.Fatalf("call %d: %v", i, err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/n, "heap-B/conn")
				b.ReportMetric(float64(int64(after.StackInuse)-int64(before.StackInuse))/n, "stack-B/conn")
				b.ReportMetric(float64(runtime.NumGoroutine()-goroutines)/n, "goroutines/conn")
				for _, c := range clients {
					_ = c.Close()
				}
			}
		})
	}
}

// BenchmarkProbe measures one Probe call on a warm connection, the call
// the agent makes most: "supervision" is the supervision connection,
// "grpc-go" the full connection (the direct path), in the same run.
func BenchmarkProbe(b *testing.B) {
	sock := filepath.Join(testutil.TempDir(b), "csi.sock")
	startPluginProcess(b, sock)
	c, err := New(Config{Socket: sock, Redial: testRedial})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	for _, kind := range []struct {
		name string
		cc   grpc.ClientConnInterface
	}{{"supervision", c.Supervision()}, {"grpc-go", c.conn}} {
		b.Run(kind.name, func(b *testing.B) {
			id := csi.NewIdentityClient(kind.cc)
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := testutil.ProcessCPU(b, os.Getpid())
			for b.Loop() {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := id.Probe(pctx, &csi.ProbeRequest{})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
			cpu := testutil.ProcessCPU(b, os.Getpid()) - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
