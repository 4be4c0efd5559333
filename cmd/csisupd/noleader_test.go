package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// leaderlessAgent refuses its first refusals Status calls as a server
// without a leader does (csisupdv1.NewNoLeaderError), then answers; with
// refusals < 0 it refuses every call, and with plain it answers a plain
// Unavailable instead.
type leaderlessAgent struct {
	csisupdv1.UnimplementedAgentServer
	refusals int64
	plain    bool
	calls    atomic.Int64
}

func (a *leaderlessAgent) Status(context.Context, *csisupdv1.StatusRequest) (*csisupdv1.StatusResponse, error) {
	n := a.calls.Add(1)
	switch {
	case a.plain:
		return nil, status.Error(codes.Unavailable, "server is shutting down")
	case a.refusals < 0 || n <= a.refusals:
		return nil, csisupdv1.NewNoLeaderError("s1", "no leader elected")
	}
	return &csisupdv1.StatusResponse{Name: "n1", Version: "test"}, nil
}

func serveAgent(t *testing.T, a csisupdv1.AgentServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csisupdv1.RegisterAgentServer(g, a)
	testutil.ServeGRPC(t, ln, g)
	return ln.Addr().String()
}

// A call refused with NoLeader is retried until it succeeds, within
// --timeout; a call refused otherwise is not retried.
func TestNoLeaderRetried(t *testing.T) {
	a := &leaderlessAgent{refusals: 2}
	addr := serveAgent(t, a)
	doc := mustJSON(t, "--address", addr, "--timeout", "20s", "status")
	if doc["name"] != "n1" {
		t.Errorf("status = %v, want the answer after the refusals", doc)
	}
	if got := a.calls.Load(); got != 3 {
		t.Errorf("the agent saw %d calls, want 3 (two refusals, one answer)", got)
	}

	plain := &leaderlessAgent{plain: true}
	_, err := execute(t, "--address", serveAgent(t, plain), "--timeout", "20s", "status")
	if err == nil || !strings.Contains(err.Error(), "server is shutting down") {
		t.Fatalf("status of an Unavailable agent = %v", err)
	}
	if got := plain.calls.Load(); got != 1 {
		t.Errorf("a plain Unavailable was tried %d times, want 1", got)
	}
}

// A call that still has no leader at --timeout fails saying that it was
// retried, how often and for how long, and does not outlive --timeout.
func TestNoLeaderRetriedInVain(t *testing.T) {
	a := &leaderlessAgent{refusals: -1}
	addr := serveAgent(t, a)
	start := time.Now()
	var stdout, stderr bytes.Buffer
	code := runWith([]string{"--address", addr, "--timeout", "1500ms", "status"}, &stdout, &stderr)
	elapsed := time.Since(start)
	if code != exitError {
		t.Errorf("exit code %d, want %d", code, exitError)
	}
	msg := stderr.String()
	for _, want := range []string{"the cluster has no leader", "server s1: no cluster leader (no leader elected)", "still no leader after ", " attempts over ", "within --timeout"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if got := a.calls.Load(); got < 2 {
		t.Errorf("the agent saw %d calls, want retries", got)
	}
	if elapsed > 1500*time.Millisecond+time.Second {
		t.Errorf("the command took %s, beyond --timeout 1.5s", elapsed)
	}
}

// The interceptor keeps the refusal's details, so that the CLI still
// tells NoLeader by its detail, and adds the retries to its message.
func TestNoLeaderRetriedErrorKeepsTheStatus(t *testing.T) {
	err := &noLeaderRetriedError{err: csisupdv1.NewNoLeaderError("s1", "no leader elected"), attempts: 4, elapsed: 1234 * time.Millisecond}
	if !csisupdv1.IsNoLeader(err) || !csisupdv1.IsRetryable(err) {
		t.Errorf("the retried error lost its details: %v", err)
	}
	st := status.Convert(err)
	if st.Code() != codes.Unavailable || st.Message() != "server s1: no cluster leader (no leader elected); still no leader after 4 attempts over 1.2s, within --timeout" {
		t.Errorf("status = %v %q", st.Code(), st.Message())
	}
}
