package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/testutil"
)

// leaderStub is a leader's Control service whose GetVolume answers as
// answer says, after marking the answer as a real leader does.
type leaderStub struct {
	csisupdv1.UnimplementedControlServer
	fwd    *forwarder
	answer func(ctx context.Context) error
}

func (l *leaderStub) GetVolume(ctx context.Context, _ *csisupdv1.VolumeGetRequest) (*csisupdv1.VolumeGetResponse, error) {
	l.fwd.markAnswered(ctx)
	return nil, l.answer(ctx)
}

// serveLeader serves a leaderStub on a loopback port and returns its
// address and its server.
func serveLeader(t *testing.T, answer func(ctx context.Context) error) (string, *grpc.Server) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csisupdv1.RegisterControlServer(g, &leaderStub{fwd: &forwarder{id: "s1"}, answer: answer})
	testutil.ServeGRPC(t, ln, g)
	return ln.Addr().String(), g
}

// forwardClient returns the Control client a follower ("s2") forwards
// to the leader at addr with, on a pooled connection.
func forwardClient(t *testing.T, addr string) csisupdv1.ControlClient {
	t.Helper()
	conn, _ := leaderConnection(t, addr)
	return csisupdv1.NewControlClient(leaderClientConn{conn: conn, server: "s2"})
}

// leaderConnection returns a pooled connection to the leader at addr, and
// its pool.
func leaderConnection(t *testing.T, addr string) (*grpc.ClientConn, *connPool) {
	t.Helper()
	pool := newConnPool(retry.Policy{Base: 10 * time.Millisecond, Cap: 100 * time.Millisecond, Multiplier: 2}, []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials())})
	t.Cleanup(pool.close)
	conn, err := pool.get(addr)
	if err != nil {
		t.Fatal(err)
	}
	return conn, pool
}

// forwardGet forwards a GetVolume with cl as a follower does.
func forwardGet(ctx context.Context, cl csisupdv1.ControlClient) error {
	ctx = metadata.AppendToOutgoingContext(ctx, forwardedKey, "s2")
	_, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v"})
	return err
}

// A follower tells the leader's answers from the loss of the leader: only
// the loss becomes NoLeader, and each answer passes unchanged.
func TestForwardedCallNamesALostLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	answers := []struct {
		name   string
		answer error
	}{
		{"plain unavailable", status.Error(codes.Unavailable, "every controller candidate failed")},
		{"typed unavailable", csisupdv1.NewPluginUnhealthyError("p1", "unhealthy", "probe failed")},
		{"not found", status.Error(codes.NotFound, `volume "v" not found`)},
	}
	for _, tt := range answers {
		t.Run("answer "+tt.name, func(t *testing.T) {
			addr, _ := serveLeader(t, func(context.Context) error { return tt.answer })
			err := forwardGet(ctx, forwardClient(t, addr))
			if csisupdv1.IsNoLeader(err) || status.Code(err) != status.Code(tt.answer) ||
				status.Convert(err).Message() != status.Convert(tt.answer).Message() {
				t.Fatalf("forwarded answer = %v, want %v unchanged", err, tt.answer)
			}
		})
	}

	t.Run("leader dies during the call", func(t *testing.T) {
		entered := make(chan struct{})
		addr, g := serveLeader(t, func(ctx context.Context) error {
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		})
		cl := forwardClient(t, addr)
		errc := make(chan error, 1)
		go func() { errc <- forwardGet(ctx, cl) }()
		select {
		case <-entered:
		case <-ctx.Done():
			t.Fatal("the call did not reach the leader")
		}
		g.Stop() // closes the connection under the call, as a killed leader does
		var err error
		select {
		case err = <-errc:
		case <-ctx.Done():
			t.Fatal("the forwarded call did not end")
		}
		wantLostLeader(t, err, addr)
	})

	t.Run("leader not reachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		wantLostLeader(t, forwardGet(ctx, forwardClient(t, addr)), addr)
	})
}

// heldForwardClient is forwardClient for a request that waits for a
// leader for hold: a refusal before the leader ran the request, or a call
// that never reached it, is sent again to the leader at addr.
func heldForwardClient(t *testing.T, addr string, hold time.Duration) csisupdv1.ControlClient {
	t.Helper()
	conn, pool := leaderConnection(t, addr)
	f := &forwarder{id: "s2", hold: hold}
	return csisupdv1.NewControlClient(leaderClientConn{conn: conn, server: "s2", hold: f.newHold(),
		resolve: func() (*grpc.ClientConn, bool, error) {
			conn, err := pool.get(addr)
			return conn, false, err
		}})
}

// A forwarded request that the leader refused before running it is sent
// again within the hold, as an election ends; one that may have run is
// never sent twice.
func TestForwardedCallWaitsForALeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stub := &forwarder{id: "s1"}

	t.Run("refused twice, then answered", func(t *testing.T) {
		var calls atomic.Int32
		addr, _ := serveLeader(t, func(ctx context.Context) error {
			if calls.Add(1) <= 2 {
				return stub.refuseForwarded(ctx, "leader not ready yet")
			}
			return status.Error(codes.NotFound, `volume "v" not found`)
		})
		err := forwardGet(ctx, heldForwardClient(t, addr, 10*time.Second))
		if status.Code(err) != codes.NotFound || calls.Load() != 3 {
			t.Fatalf("held call = %v after %d calls, want the leader's NotFound on the third", err, calls.Load())
		}
	})

	t.Run("refused until the hold ends", func(t *testing.T) {
		var calls atomic.Int32
		addr, _ := serveLeader(t, func(ctx context.Context) error {
			calls.Add(1)
			return stub.refuseForwarded(ctx, "not the leader, and the request was forwarded already")
		})
		err := forwardGet(ctx, heldForwardClient(t, addr, 300*time.Millisecond))
		if !csisupdv1.IsNoLeader(err) || calls.Load() < 2 {
			t.Fatalf("call refused throughout the hold = %v after %d calls, want NoLeader after more than one call", err, calls.Load())
		}
	})

	t.Run("the leader may have run it", func(t *testing.T) {
		var calls atomic.Int32
		addr, g := serveLeader(t, func(ctx context.Context) error {
			calls.Add(1)
			<-ctx.Done()
			return ctx.Err()
		})
		errc := make(chan error, 1)
		go func() { errc <- forwardGet(ctx, heldForwardClient(t, addr, 10*time.Second)) }()
		testutil.WaitFor(t, 10*time.Second, "the call to reach the leader", func() bool { return calls.Load() == 1 })
		g.Stop()
		select {
		case err := <-errc:
			wantLostLeader(t, err, addr)
		case <-ctx.Done():
			t.Fatal("the forwarded call did not end")
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("a call the leader may have run was sent %d times, want once", n)
		}
	})
}

func wantLostLeader(t *testing.T, err error, addr string) {
	t.Helper()
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.NoLeader](err)
	if !ok || status.Code(err) != codes.Unavailable || d.GetServer() != "s2" ||
		!strings.Contains(d.GetReason(), "the leader at "+addr+" did not answer") {
		t.Fatalf("error = %v (NoLeader %v), want Unavailable with NoLeader from s2 naming the leader at %s", err, d, addr)
	}
}

// Raft's leadership errors are NoLeader; others keep their code.
func TestToStatusOfRaftErrors(t *testing.T) {
	tests := []struct {
		err      error
		code     codes.Code
		noLeader bool
	}{
		{raft.ErrNotLeader, codes.Unavailable, true},
		{fmt.Errorf("apply: %w", raft.ErrLeadershipLost), codes.Unavailable, true},
		{raft.ErrLeadershipTransferInProgress, codes.Unavailable, true},
		{fmt.Errorf("leader rpc address: %w", raftnode.ErrNoLeader), codes.Unavailable, true},
		{raft.ErrEnqueueTimeout, codes.Unavailable, false},
		{raft.ErrRaftShutdown, codes.Unavailable, false},
		{context.DeadlineExceeded, codes.DeadlineExceeded, false},
		{errors.New("boom"), codes.Internal, false},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			got := toStatus(tt.err)
			if status.Code(got) != tt.code || csisupdv1.IsNoLeader(got) != tt.noLeader {
				t.Fatalf("toStatus(%v) = %v (NoLeader %v), want %s, NoLeader %v", tt.err, got, csisupdv1.IsNoLeader(got), tt.code, tt.noLeader)
			}
			if tt.noLeader && !strings.Contains(status.Convert(got).Message(), tt.err.Error()) {
				t.Errorf("message %q does not say the condition %q", status.Convert(got).Message(), tt.err)
			}
		})
	}
}
