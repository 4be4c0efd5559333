package rpc

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// benchCallers is the number of concurrent callers in the benchmarks.
const benchCallers = 16

// measure makes n calls from benchCallers goroutines and returns the
// latency of each and the wall time of all.
func measure(n int, call func(context.Context) error) ([]time.Duration, time.Duration, error) {
	ctx := context.Background()
	var next atomic.Int64
	per := make([][]time.Duration, benchCallers)
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for g := range benchCallers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := call(ctx); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				per[g] = append(per[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		return nil, 0, err
	}
	return slices.Concat(per...), elapsed, nil
}

// latencies summarise calls.
type latencies struct {
	p50, p99 time.Duration
	perSec   float64
}

func summarise(all []time.Duration, elapsed time.Duration) latencies {
	slices.Sort(all)
	return latencies{
		p50:    all[len(all)*50/100],
		p99:    all[len(all)*99/100],
		perSec: float64(len(all)) / elapsed.Seconds(),
	}
}

// report adds l as metrics; prefix names the path in a combined run.
func (l latencies) report(b *testing.B, prefix string) {
	b.ReportMetric(float64(l.p50.Nanoseconds()), prefix+"p50-ns")
	b.ReportMetric(float64(l.p99.Nanoseconds()), prefix+"p99-ns")
	b.ReportMetric(l.perSec, prefix+"calls/s")
}

// runCallers makes b.N calls from benchCallers goroutines and reports them.
func runCallers(b *testing.B, call func(context.Context) error) {
	b.Helper()
	b.ResetTimer()
	all, elapsed, err := measure(b.N, call)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	summarise(all, elapsed).report(b, "")
}

// BenchmarkClientCSIValidateVolume measures ValidateVolumeCapabilities on
// testplugin with 16 concurrent callers, directly (direct) and through
// ClientCSI on an agent (clientcsi), both over unix sockets in the same run.
// vs-direct alternates rounds of the two and reports ClientCSI's p50 and p99
// as multiples of the direct call's (p50-x-direct, p99-x-direct), and the
// floor of any agent in between measured in the same rounds: a bare gRPC
// relay's p50 over the direct call's (relay-p50-x-direct) and ClientCSI's
// over the relay's (p50-x-relay). The agent's ClientCSI is served with an
// agent's server options (ServerOptions: metrics, limits, stream workers,
// windows and the authorizer), as a real agent serves it.
func BenchmarkClientCSIValidateVolume(b *testing.B) {
	env := newManagedEnv(b, "bench", testplugin.Config{}, ClientCSIConfig{}, hclog.NewNullLogger())
	vol := createVolume(b, env.client, "bench", "bench-vol")
	req := &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol, VolumeCapabilities: []*csi.VolumeCapability{mountCap}}

	conn, err := grpc.NewClient("unix://"+env.plugin.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	direct := csi.NewControllerClient(conn)
	viaReq := &csisupdv1.ControllerValidateVolumeRequest{PluginId: "bench", Request: req}

	directCall := func(ctx context.Context) error {
		_, err := direct.ValidateVolumeCapabilities(ctx, req)
		return err
	}
	viaCall := func(ctx context.Context) error {
		_, err := env.client.ControllerValidateVolume(ctx, viaReq)
		return err
	}
	secureCall := secureClientCSICall(b, env, viaReq)
	relay := relayCall(b, env, direct, req)
	b.Run("direct", func(b *testing.B) { runCallers(b, directCall) })
	b.Run("clientcsi", func(b *testing.B) { runCallers(b, viaCall) })
	b.Run("clientcsi-tls-acl", func(b *testing.B) { runCallers(b, secureCall) })
	// vs-direct alternates rounds of both paths so that both see the same
	// load from the rest of the machine, and reports the ratios.
	b.Run("vs-direct", func(b *testing.B) {
		const round = 512
		var d, v, sec, r []time.Duration
		var dt, vt, st, rt time.Duration
		b.ResetTimer()
		for done := 0; done < b.N; done += round {
			ld, el, err := measure(round, directCall)
			if err != nil {
				b.Fatal(err)
			}
			d, dt = append(d, ld...), dt+el
			lv, el, err := measure(round, viaCall)
			if err != nil {
				b.Fatal(err)
			}
			v, vt = append(v, lv...), vt+el
			ls, el, err := measure(round, secureCall)
			if err != nil {
				b.Fatal(err)
			}
			sec, st = append(sec, ls...), st+el
			lr, el, err := measure(round, relay)
			if err != nil {
				b.Fatal(err)
			}
			r, rt = append(r, lr...), rt+el
		}
		b.StopTimer()
		ds, vs, ss, rs := summarise(d, dt), summarise(v, vt), summarise(sec, st), summarise(r, rt)
		ds.report(b, "direct-")
		vs.report(b, "clientcsi-")
		ss.report(b, "tls-acl-")
		rs.report(b, "relay-")
		b.ReportMetric(float64(vs.p50)/float64(ds.p50), "p50-x-direct")
		b.ReportMetric(float64(vs.p99)/float64(ds.p99), "p99-x-direct")
		// The floor of any agent in between: a bare gRPC relay's p50 over
		// the direct call's, and ClientCSI's over the relay's.
		b.ReportMetric(float64(rs.p50)/float64(ds.p50), "relay-p50-x-direct")
		b.ReportMetric(float64(vs.p50)/float64(rs.p50), "p50-x-relay")
		// TLS and ACLs against the plain ClientCSI path (target p50 <= 1.3x).
		b.ReportMetric(float64(ss.p50)/float64(vs.p50), "tls-acl-p50-x-plain")
		b.ReportMetric(float64(ss.p99)/float64(vs.p99), "tls-acl-p99-x-plain")
	})
}

// relayServer is the least an agent between a caller and a plugin can do:
// a gRPC server on a unix socket whose ValidateVolumeCapabilities makes
// the same call on the plugin's connection, nothing else.
type relayServer struct {
	csi.UnimplementedControllerServer
	plugin csi.ControllerClient
}

func (r relayServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	return r.plugin.ValidateVolumeCapabilities(ctx, req)
}

// relayCall serves a relayServer to plugin (with the agent's stream
// workers, so that its goroutines do not grow their stacks on every call)
// and returns the ValidateVolumeCapabilities call through it: the floor of
// the ClientCSI path's second gRPC hop, measured in the same run.
func relayCall(b *testing.B, env *managedEnv, plugin csi.ControllerClient, req *csi.ValidateVolumeCapabilitiesRequest) func(context.Context) error {
	b.Helper()
	srv := grpc.NewServer(grpc.NumStreamWorkers(16))
	csi.RegisterControllerServer(srv, relayServer{plugin: plugin})
	sock := filepath.Join(env.dir, "relay.sock")
	testutil.ServeGRPC(b, testutil.ListenUnix(b, sock), srv)
	client := csi.NewControllerClient(testutil.DialGRPC(b, "unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())))
	return func(ctx context.Context) error {
		_, err := client.ValidateVolumeCapabilities(ctx, req)
		return err
	}
}

// secureClientCSICall serves ClientCSI of env a second time, on its own
// unix socket, with mutual TLS and ACLs on as an agent without the server
// role runs it: the caller presents a CLI certificate and a token that
// allows volume:read, which the agent resolves through its token cache
// (the servers' answer is in the cache after the first call). It returns
// the ValidateVolume call on that path.
func secureClientCSICall(b *testing.B, env *managedEnv, req *csisupdv1.ControllerValidateVolumeRequest) func(context.Context) error {
	b.Helper()
	pki := newMatrixPKI(b)
	const secret = "bench-reader-secret"
	cache, err := NewTokenCache(TokenCacheConfig{Fetch: func(_ context.Context, s string) (*csisupdv1.ResolveTokenResponse, error) {
		if s != secret {
			return nil, acl.ErrTokenNotFound
		}
		return &csisupdv1.ResolveTokenResponse{
			Token:    &csisupdv1.ACLToken{AccessorId: "bench", Type: acl.TypeClient, Policies: []string{"reader"}},
			Policies: []*csisupdv1.ACLPolicy{{Name: "reader", Rules: `volume { policy = "read" }`}},
		}, nil
	}})
	if err != nil {
		b.Fatal(err)
	}
	auth, err := NewAuthorizer(AuthConfig{TLS: true, ACL: true, Resolver: cache})
	if err != nil {
		b.Fatal(err)
	}
	client := serveClientCSIOn(b, filepath.Join(env.dir, "secure.sock"),
		ClientCSIConfig{Plugins: env.manager, Logger: hclog.NewNullLogger()},
		append(agentServerOptions(b, auth), pki.serverCreds(b, true)), pki.dialOptions(b, tlsutil.RoleCLI, secret))
	return func(ctx context.Context) error {
		_, err := client.ControllerValidateVolume(ctx, req)
		return err
	}
}
