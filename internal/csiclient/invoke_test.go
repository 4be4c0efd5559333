package csiclient

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/secrets"
	"github.com/csisupd/csisupd/internal/testutil"
)

// scriptedPlugin is a real CSI plugin on a unix socket whose CreateVolume
// and NodePublishVolume answer what answer says for the n-th call (1
// based) with the request's secrets: nil is success.
type scriptedPlugin struct {
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	answer func(n int, secrets map[string]string) error
	calls  atomic.Int64
}

func (p *scriptedPlugin) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := p.answer(int(p.calls.Add(1)), req.GetSecrets()); err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetName()}}, nil
}

func (p *scriptedPlugin) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := p.answer(int(p.calls.Add(1)), req.GetSecrets()); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// servePlugin serves p's controller and node services on a socket in a
// new directory until the test ends, and returns a Client connected to it.
func servePlugin(t *testing.T, p *scriptedPlugin) *Client {
	t.Helper()
	socket := filepath.Join(testutil.TempDir(t), "csi.sock")
	srv := grpc.NewServer()
	csi.RegisterControllerServer(srv, p)
	csi.RegisterNodeServer(srv, p)
	testutil.ServeGRPC(t, testutil.ListenUnix(t, socket), srv)
	return newClient(t, Config{Socket: socket})
}

// fixedLookup is a PluginLookup of read models and connections the test
// sets.
type fixedLookup struct {
	mu      sync.Mutex
	plugins map[string]*csisupdv1.Plugin
	clients map[string]*Client
}

func (f *fixedLookup) Lookup(id string) (*csisupdv1.Plugin, *Client, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.plugins[id]
	if !ok {
		return nil, nil, false
	}
	return proto.Clone(p).(*csisupdv1.Plugin), f.clients[id], true
}

// monolith is the read model of a healthy monolith plugin with a
// controller and a node capability.
func monolith(id string) *csisupdv1.Plugin {
	return &csisupdv1.Plugin{
		Id: id, Type: string(plugin.TypeMonolith), Healthy: true, HealthState: "healthy",
		PluginCapabilities:     []string{plugin.CapControllerService},
		ControllerCapabilities: []string{plugin.CapCreateDeleteVolume},
		NodeCapabilities:       []string{plugin.CapStageUnstageVolume},
	}
}

// shortRetry makes the waits between attempts a few milliseconds.
var shortRetry = retry.Policy{Base: time.Millisecond, Cap: 2 * time.Millisecond, Multiplier: 2}

// longRetry waits ten seconds before a retry, which no test waits for.
var longRetry = retry.Policy{Base: 10 * time.Second, Cap: 10 * time.Second, Multiplier: 2}

// invokeEnv is an Invoker over one scripted plugin, "p", whose log lines
// go to logs.
type invokeEnv struct {
	plugin *scriptedPlugin
	inv    *Invoker
	logs   *testutil.SyncBuffer
}

func newInvokeEnv(t *testing.T, policy retry.Policy, answer func(n int, secrets map[string]string) error) *invokeEnv {
	t.Helper()
	p := &scriptedPlugin{answer: answer}
	client := servePlugin(t, p)
	logs := &testutil.SyncBuffer{}
	inv, err := NewInvoker(InvokerConfig{
		Plugins:  &fixedLookup{plugins: map[string]*csisupdv1.Plugin{"p": monolith("p")}, clients: map[string]*Client{"p": client}},
		NodeName: "node-1",
		Retry:    policy,
		Logger:   hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs}),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &invokeEnv{plugin: p, inv: inv, logs: logs}
}

// createVolume is a controller call of "p" that waits at most a minute
// when its context has no deadline.
var createVolume = Call{PluginID: "p", Method: "ControllerCreateVolume", CSIMethod: "CreateVolume", Timeout: time.Minute}

func (e *invokeEnv) create(ctx context.Context, secrets map[string]string) error {
	_, err := createVolumeCall(ctx, e.inv, createVolume, &csi.CreateVolumeRequest{Name: "v", Secrets: secrets})
	return err
}

// createVolumeCall invokes c as CreateVolume with req.
func createVolumeCall(ctx context.Context, inv *Invoker, c Call, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return Invoke(ctx, inv, ControllerService, c, req, func(ctx context.Context, cl *Client) (*csi.CreateVolumeResponse, error) {
		return cl.Controller.CreateVolume(ctx, req)
	})
}

func TestInvokeRetriesRetryableCodesOnly(t *testing.T) {
	tests := []struct {
		code     codes.Code
		attempts int64
	}{
		{codes.Unavailable, MaxAttempts},
		{codes.ResourceExhausted, MaxAttempts},
		{codes.DeadlineExceeded, MaxAttempts}, // the plugin's own, not the caller's
		{codes.InvalidArgument, 1},
		{codes.NotFound, 1},
		{codes.FailedPrecondition, 1},
		{codes.Internal, 1},
		{codes.Unknown, 1},
		{codes.Canceled, 1},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			e := newInvokeEnv(t, shortRetry, func(int, map[string]string) error { return status.Error(tt.code, "no") })
			err := e.create(context.Background(), nil)
			if status.Code(err) != tt.code {
				t.Errorf("error = %v, want the plugin's %s", err, tt.code)
			}
			if n := e.plugin.calls.Load(); n != tt.attempts {
				t.Errorf("the plugin saw %d attempts, want %d", n, tt.attempts)
			}
			if got := RetryableCode(tt.code); got != (tt.attempts > 1) {
				t.Errorf("RetryableCode(%s) = %t", tt.code, got)
			}
		})
	}
}

func TestInvokeRetrySucceeds(t *testing.T) {
	e := newInvokeEnv(t, shortRetry, func(n int, _ map[string]string) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "restarting")
		}
		return nil
	})
	resp, err := createVolumeCall(context.Background(), e.inv, createVolume, &csi.CreateVolumeRequest{Name: "v1"})
	if err != nil || resp.GetVolume().GetVolumeId() != "v1" {
		t.Fatalf("CreateVolume = %v, %v; want volume v1 at the second attempt", resp, err)
	}
	if n := e.plugin.calls.Load(); n != 2 {
		t.Errorf("the plugin saw %d attempts, want 2", n)
	}
}

func TestInvokeDoesNotRetryPastTheDeadline(t *testing.T) {
	// A retry would wait ten seconds; the caller's deadline leaves less:
	// the plugin's error is returned at once, after one attempt.
	e := newInvokeEnv(t, longRetry, func(int, map[string]string) error { return status.Error(codes.Unavailable, "restarting") })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := e.create(ctx, nil)
	if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
		t.Errorf("error = %v (context %v), want the plugin's Unavailable before the deadline", err, ctx.Err())
	}
	if n := e.plugin.calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d attempts, want 1", n)
	}
}

func TestInvokeEndsWithTheCallersContext(t *testing.T) {
	// cancelOnRetry cancels the caller's context when the invoker logs
	// that it will wait for a retry: the wait must end with Canceled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newInvokeEnv(t, longRetry, func(int, map[string]string) error { return status.Error(codes.Unavailable, "restarting") })
	e.inv.log = hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: cancelOnRetry{cancel}})
	if err := e.create(ctx, nil); status.Code(err) != codes.Canceled {
		t.Errorf("error = %v, want Canceled", err)
	}
	if n := e.plugin.calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d attempts, want 1", n)
	}

	// A context that has ended before the call never reaches the plugin.
	for _, tt := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want codes.Code
	}{
		{"canceled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, codes.Canceled},
		{"expired", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		}, codes.DeadlineExceeded},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newInvokeEnv(t, shortRetry, func(int, map[string]string) error { return nil })
			ctx, cancel := tt.ctx()
			defer cancel()
			if err := e.create(ctx, nil); status.Code(err) != tt.want {
				t.Errorf("error = %v, want %s", err, tt.want)
			}
			if n := e.plugin.calls.Load(); n != 0 {
				t.Errorf("the plugin saw %d calls, want none", n)
			}
		})
	}
}

// cancelOnRetry is a log output that calls cancel at the retry line.
type cancelOnRetry struct{ cancel context.CancelFunc }

func (c cancelOnRetry) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "attempt failed; retrying") {
		c.cancel()
	}
	return len(p), nil
}

func TestInvokeRedactsSecrets(t *testing.T) {
	const secret = "tok-123-secret"
	secrets := map[string]string{"token": secret}
	info := &errdetails.ErrorInfo{Reason: "AUTH"}
	tests := []struct {
		name     string
		answer   error
		code     codes.Code
		attempts int64
	}{
		{"final error", status.Error(codes.PermissionDenied, "token "+secret+" refused"), codes.PermissionDenied, 1},
		{"retried error", status.Error(codes.Unavailable, "token "+secret+" refused"), codes.Unavailable, MaxAttempts},
		{"with details", func() error {
			st, err := status.New(codes.PermissionDenied, "token "+secret+" refused").WithDetails(info)
			if err != nil {
				t.Fatal(err)
			}
			return st.Err()
		}(), codes.PermissionDenied, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newInvokeEnv(t, shortRetry, func(_ int, got map[string]string) error {
				if got["token"] != secret {
					return status.Error(codes.Internal, "the secret did not reach the plugin")
				}
				return tt.answer
			})
			err := e.create(context.Background(), secrets)
			st := status.Convert(err)
			if st.Code() != tt.code || st.Message() != "token "+Redacted+" refused" {
				t.Errorf("error = %v, want %s with the secret redacted", err, tt.code)
			}
			if want := status.Convert(tt.answer).Details(); len(want) != len(st.Details()) {
				t.Errorf("details = %v, want %v", st.Details(), want)
			}
			if n := e.plugin.calls.Load(); n != tt.attempts {
				t.Errorf("the plugin saw %d attempts, want %d", n, tt.attempts)
			}
			logs := e.logs.String()
			if strings.Contains(logs, secret) || !strings.Contains(logs, Redacted) || !strings.Contains(logs, "refused") {
				t.Errorf("the log holds the secret, or lacks the request and the error:\n%s", logs)
			}
		})
	}

	// An error that is not a gRPC status is redacted too, and becomes
	// Unknown, the code a gRPC server would send it with.
	e := newInvokeEnv(t, shortRetry, func(int, map[string]string) error { return nil })
	_, err := Invoke(context.Background(), e.inv, ControllerService, createVolume, &csi.CreateVolumeRequest{Secrets: secrets},
		func(context.Context, *Client) (struct{}, error) {
			return struct{}{}, errors.New("backend said " + secret)
		})
	if st := status.Convert(err); st.Code() != codes.Unknown || st.Message() != "backend said "+Redacted {
		t.Errorf("error = %v, want Unknown with the secret redacted", err)
	}
	if strings.Contains(e.logs.String(), secret) {
		t.Errorf("the log holds the secret:\n%s", e.logs.String())
	}
}

func TestRedactError(t *testing.T) {
	req := &csi.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"token": "tok-123"}}
	withDetail, err := status.New(codes.PermissionDenied, "token tok-123 refused").WithDetails(&errdetails.ErrorInfo{Reason: "AUTH"})
	if err != nil {
		t.Fatal(err)
	}
	clean := status.Error(codes.NotFound, "volume v not found")

	got := status.Convert(RedactError(withDetail.Err(), req))
	if got.Code() != codes.PermissionDenied || got.Message() != "token "+Redacted+" refused" {
		t.Errorf("redacted status = %s %q", got.Code(), got.Message())
	}
	if d := got.Details(); len(d) != 1 || !proto.Equal(d[0].(proto.Message), &errdetails.ErrorInfo{Reason: "AUTH"}) {
		t.Errorf("details = %v, want the ErrorInfo kept", d)
	}
	if e := RedactError(clean, req); e != clean {
		t.Errorf("an error without secrets was rebuilt: %v", e)
	}
	for _, plain := range []error{errors.New("token tok-123 refused"), errors.New("no secret here")} {
		got := status.Convert(RedactError(plain, req))
		if want := strings.ReplaceAll(plain.Error(), "tok-123", Redacted); got.Code() != codes.Unknown || got.Message() != want {
			t.Errorf("RedactError(%q) = %s %q, want Unknown %q", plain, got.Code(), got.Message(), want)
		}
	}
	if RedactError(nil, req) != nil {
		t.Error("RedactError(nil) is not nil")
	}
}

func TestResolve(t *testing.T) {
	client := newClient(t, Config{Socket: filepath.Join(testutil.TempDir(t), "csi.sock")})
	unhealthy := monolith("sick")
	unhealthy.Healthy, unhealthy.HealthState, unhealthy.HealthDescription = false, "unhealthy", "probe failed"
	controller := monolith("ctrl")
	controller.Type, controller.NodeCapabilities = string(plugin.TypeController), nil
	node := monolith("node")
	node.Type, node.PluginCapabilities, node.ControllerCapabilities = string(plugin.TypeNode), nil, nil
	lookup := &fixedLookup{
		plugins: map[string]*csisupdv1.Plugin{"p": monolith("p"), "new": monolith("new"), "sick": unhealthy, "ctrl": controller, "node": node},
		clients: map[string]*Client{"p": client, "sick": client, "ctrl": client, "node": client},
	}
	inv, err := NewInvoker(InvokerConfig{Plugins: lookup, NodeName: "node-1", Retry: shortRetry})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		svc        Service
		id, need   string
		code       codes.Code
		missing    string // the CapabilityMissing capability, if any
		unhealthy  string // the PluginUnhealthy state, if any
		notFoundOn string // the PluginNotFound node, if any
	}{
		{"controller call", ControllerService, "p", plugin.CapCreateDeleteVolume, codes.OK, "", "", ""},
		{"node call", NodeService, "p", plugin.CapStageUnstageVolume, codes.OK, "", "", ""},
		{"no capability needed", NodeService, "node", "", codes.OK, "", "", ""},
		{"no plugin id", ControllerService, "", "", codes.InvalidArgument, "", "", ""},
		{"no such plugin", ControllerService, "gone", "", codes.NotFound, "", "", "node-1"},
		{"unhealthy", ControllerService, "sick", "", codes.Unavailable, "", "unhealthy", ""},
		{"not fingerprinted", NodeService, "new", "", codes.Unavailable, "", "unknown", ""},
		{"controller service missing", ControllerService, "node", "", codes.FailedPrecondition, plugin.CapControllerService, "", ""},
		{"node service missing", NodeService, "ctrl", "", codes.FailedPrecondition, plugin.CapNodeService, "", ""},
		{"controller capability missing", ControllerService, "p", plugin.CapListSnapshots, codes.FailedPrecondition, plugin.CapListSnapshots, "", ""},
		{"node capability missing", NodeService, "p", plugin.CapGetVolumeStats, codes.FailedPrecondition, plugin.CapGetVolumeStats, "", ""},
		{"capability of the other service", NodeService, "p", plugin.CapCreateDeleteVolume, codes.FailedPrecondition, plugin.CapCreateDeleteVolume, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, c, err := inv.Resolve(tt.svc, Call{PluginID: tt.id, Method: "Method", Capability: tt.need})
			if status.Code(err) != tt.code {
				t.Fatalf("Resolve = %v, want %s", err, tt.code)
			}
			if tt.code == codes.OK {
				if p.GetId() != tt.id || c != client {
					t.Errorf("Resolve = %v, %p; want plugin %s with its client", p, c, tt.id)
				}
				return
			}
			if d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err); ok != (tt.missing != "") || d.GetCapability() != tt.missing {
				t.Errorf("CapabilityMissing = %v, want %q", d, tt.missing)
			}
			if d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginUnhealthy](err); ok != (tt.unhealthy != "") || d.GetHealthState() != tt.unhealthy {
				t.Errorf("PluginUnhealthy = %v, want state %q", d, tt.unhealthy)
			}
			if d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginNotFound](err); ok != (tt.notFoundOn != "") || d.GetNode() != tt.notFoundOn {
				t.Errorf("PluginNotFound = %v, want node %q", d, tt.notFoundOn)
			}
		})
	}
}

func TestInvokeFindsThePluginBeforeEachAttempt(t *testing.T) {
	// The plugin fails with Unavailable and is found unhealthy before the
	// retry: the retry is refused with the typed error, and the plugin
	// sees one attempt.
	var lookup *fixedLookup
	p := &scriptedPlugin{answer: func(int, map[string]string) error {
		lookup.mu.Lock()
		lookup.plugins["p"].Healthy = false
		lookup.mu.Unlock()
		return status.Error(codes.Unavailable, "restarting")
	}}
	client := servePlugin(t, p)
	lookup = &fixedLookup{plugins: map[string]*csisupdv1.Plugin{"p": monolith("p")}, clients: map[string]*Client{"p": client}}
	inv, err := NewInvoker(InvokerConfig{Plugins: lookup, Retry: shortRetry})
	if err != nil {
		t.Fatal(err)
	}
	req := &csi.NodePublishVolumeRequest{}
	_, err = Invoke(context.Background(), inv, NodeService, Call{PluginID: "p", Method: "MountVolume", CSIMethod: "NodePublishVolume", Timeout: time.Minute}, req,
		func(ctx context.Context, cl *Client) (*csi.NodePublishVolumeResponse, error) {
			return cl.Node.NodePublishVolume(ctx, req)
		})
	if _, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginUnhealthy](err); !ok {
		t.Errorf("error = %v, want PluginUnhealthy", err)
	}
	if n := p.calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d attempts, want 1", n)
	}
}

func TestInvokeHoldsTheSlotDuringEachAttempt(t *testing.T) {
	var held, taken atomic.Int64
	e := newInvokeEnv(t, shortRetry, func(int, map[string]string) error {
		if held.Load() != 1 {
			return status.Error(codes.Internal, "called without the slot")
		}
		return status.Error(codes.Unavailable, "restarting")
	})
	c := createVolume
	c.Slot = func(context.Context) (func(), error) {
		held.Add(1)
		taken.Add(1)
		return func() { held.Add(-1) }, nil
	}
	if _, err := createVolumeCall(context.Background(), e.inv, c, &csi.CreateVolumeRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("error = %v, want the plugin's Unavailable", err)
	}
	if taken.Load() != MaxAttempts || held.Load() != 0 {
		t.Errorf("the slot was taken %d times and is held %d times after the call, want %d and 0", taken.Load(), held.Load(), MaxAttempts)
	}

	c.Slot = func(ctx context.Context) (func(), error) { return nil, status.Error(codes.Aborted, "no slot") }
	if _, err := createVolumeCall(context.Background(), e.inv, c, &csi.CreateVolumeRequest{}); status.Code(err) != codes.Aborted {
		t.Errorf("error = %v, want the slot's Aborted", err)
	}
	if n := e.plugin.calls.Load(); n != MaxAttempts {
		t.Errorf("the plugin saw %d calls, want only the %d of the first call", n, MaxAttempts)
	}
}

func TestNewInvokerConfig(t *testing.T) {
	if _, err := NewInvoker(InvokerConfig{}); err == nil ||
		!strings.Contains(err.Error(), "Plugins is required") || !strings.Contains(err.Error(), "InvokerConfig.Retry") {
		t.Errorf("NewInvoker(empty) = %v, want errors naming Plugins and Retry", err)
	}
}

func TestInvokeAddsTheNodesSecrets(t *testing.T) {
	// The node's secrets file of the plugin reaches the plugin on every
	// call, under the caller's own secrets, and is redacted from the
	// error and the log like them.
	const fileSecret = "from-the-node-file-5e7"
	path := filepath.Join(testutil.TempDir(t), "p.hcl")
	if err := os.WriteFile(path, []byte("default { token = \""+fileSecret+"\" }\ncontroller { user = \"file\" }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store := secrets.NewStore(nil)
	if err := store.Load(map[string]string{"p": path}); err != nil {
		t.Fatal(err)
	}
	var seen map[string]string
	e := newInvokeEnv(t, shortRetry, func(_ int, got map[string]string) error {
		seen = got
		return status.Error(codes.PermissionDenied, "token "+got["token"]+" refused")
	})
	e.inv.secrets = store
	err := e.create(context.Background(), map[string]string{"user": "caller"})
	if seen["token"] != fileSecret || seen["user"] != "caller" {
		t.Errorf("the plugin got token from the file: %v, user %q; want the file's token and the caller's user", seen["token"] == fileSecret, seen["user"])
	}
	if st := status.Convert(err); st.Message() != "token "+Redacted+" refused" {
		t.Errorf("error = %v, want the file's secret redacted", err)
	}
	if strings.Contains(e.logs.String(), fileSecret) {
		t.Errorf("the log holds the file's secret:\n%s", e.logs.String())
	}
}
