package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/retry"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/state"
)

// forwardedKey marks a request a follower forwarded to the leader, so it is
// never forwarded twice.
const forwardedKey = "csisupd-forwarded"

// connPool caches one client connection per address.
type connPool struct {
	mu     sync.Mutex
	opts   []grpc.DialOption
	conns  map[string]*grpc.ClientConn
	closed bool
}

// newConnPool dials with opts (insecure transport credentials when none),
// reconnecting on the connect policy: a restarted server or agent is
// reached again within seconds, not gRPC's default two minutes. Options
// given by the caller come later and win.
func newConnPool(connect retry.Policy, opts []grpc.DialOption) *connPool {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// A call that reaches no server or agent is marked, so that the caller
	// tells a node that cannot be reached from one that answered.
	opts = append(append([]grpc.DialOption{grpc.WithConnectParams(connect.ConnectParams(minConnectTimeout))},
		csisupdv1.NotReachedInterceptors()...), opts...)
	return &connPool{opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// minConnectTimeout is the least time one connection attempt is given.
const minConnectTimeout = 5 * time.Second

func (p *connPool) get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, status.Error(codes.Unavailable, "server is shutting down")
	}
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := grpc.NewClient(addr, p.opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	p.conns[addr] = c
	return c, nil
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// forwarder decides where a leader-only request runs, and gives the
// connection to the leader when that is not this server.
type forwarder struct {
	// id is this server's id, which a forwarded request carries.
	id string
	// leader describes this server as the leader that answered a request
	// (csisupdv1.LeaderTrailerKey): its name and RPC address.
	leader string
	node   *raftnode.Node
	// ready is set while this server leads and has taken over.
	ready *atomic.Bool
	// conns are the connections to the other servers.
	conns *connPool
	// count counts one forwarded request.
	count func(ctx context.Context)
	// hold is how long a request waits for a leader while the servers
	// elect one; zero is leaderHoldTimeout.
	hold time.Duration
}

// leaderHoldTimeout is how long a request that needs the leader waits for
// one, as Nomad's and Consul's RPC hold timeout does: an election takes a
// few heartbeat timeouts, and a caller should see it as latency, not as an
// error it must retry. A request never waits past its own deadline.
const leaderHoldTimeout = 5 * time.Second

// leaderHoldRetry spaces the looks for a leader during a hold.
var leaderHoldRetry = retry.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond, Multiplier: 2, Jitter: 0.5}

// leaderHold is the wait of one request for a leader.
type leaderHold struct {
	until time.Time
	wait  *retry.BackOff
}

func (f *forwarder) newHold() *leaderHold {
	d := f.hold
	if d <= 0 {
		d = leaderHoldTimeout
	}
	return &leaderHold{until: time.Now().Add(d), wait: leaderHoldRetry.NewBackOff()}
}

// again waits before the next look for a leader. It reports false, at
// once, when the hold or ctx would end first: the caller then returns the
// error it has.
func (h *leaderHold) again(ctx context.Context) bool {
	d := h.wait.NextBackOff()
	if time.Now().Add(d).After(h.until) {
		return false
	}
	if deadline, ok := ctx.Deadline(); ok && time.Now().Add(d).After(deadline) {
		return false
	}
	return retry.Wait(ctx, d) == nil
}

// leaderConn decides where a leader-only request runs. It returns a nil
// connection when this server is the ready leader; otherwise a connection to
// the leader (a leaderClientConn) and a context marked as forwarded.
//
// A request a caller sent to this server waits, within the leader hold,
// while there is no leader or the leader has not taken over yet; so does
// the forwarded call when the leader refuses it before running it. A
// request forwarded to this server never waits here: the server that
// forwarded it holds it, so that holds do not add up.
func (f *forwarder) leaderConn(ctx context.Context) (context.Context, grpc.ClientConnInterface, error) {
	if forwarded(ctx) {
		f.markAnswered(ctx)
		if f.node.IsLeader() && f.ready.Load() {
			return ctx, nil, nil
		}
		reason := "not the leader, and the request was forwarded already"
		if f.node.IsLeader() {
			reason = "leader not ready yet"
		}
		return ctx, nil, f.refuseForwarded(ctx, reason)
	}
	conn, electing, err := f.leaderConnOnce()
	if err == nil && conn == nil {
		// The ready leader runs the request: the hot path (heartbeats)
		// makes no hold.
		return ctx, nil, nil
	}
	hold := f.newHold()
	for {
		switch {
		case err == nil && conn == nil:
			return ctx, nil, nil
		case err == nil:
			f.count(ctx)
			return forwardContext(ctx, f.id), leaderClientConn{conn: conn, server: f.id, hold: hold, resolve: f.remoteLeader}, nil
		case !electing || !hold.again(ctx):
			return ctx, nil, err
		}
		conn, electing, err = f.leaderConnOnce()
	}
}

// refuseForwarded returns the NoLeader error of a forwarded request that
// this server refuses before running any of it, and marks the answer so:
// the server that forwarded it may send it again.
func (f *forwarder) refuseForwarded(ctx context.Context, reason string) error {
	// Fails only outside a gRPC handler, where nobody reads it.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(notRunKey, f.id))
	return csisupdv1.NewNoLeaderError(f.id, reason)
}

// leaderConnOnce looks once for where a request runs: nil and no error on
// the ready leader, the connection to the leader otherwise. electing
// reports an error that an election ends (no leader yet, or one that has
// not taken over): a request waits it out within its hold.
func (f *forwarder) leaderConnOnce() (conn *grpc.ClientConn, electing bool, err error) {
	if f.node.IsLeader() {
		if !f.ready.Load() {
			return nil, true, csisupdv1.NewNoLeaderError(f.id, "leader not ready yet")
		}
		return nil, false, nil
	}
	return f.remoteLeader()
}

// remoteLeader returns the connection to the leader when that is another
// server; electing as leaderConnOnce's.
func (f *forwarder) remoteLeader() (conn *grpc.ClientConn, electing bool, err error) {
	if f.node.IsLeader() {
		// This server took over while the request waited: it cannot run
		// the request from inside the forwarded call, so the caller
		// retries (NoLeader is retryable).
		return nil, false, csisupdv1.NewNoLeaderError(f.id, "this server became the leader while the request waited for one")
	}
	addr, err := f.node.LeaderRPCAddr()
	if err != nil {
		return nil, true, csisupdv1.NewNoLeaderError(f.id, err.Error())
	}
	conn, err = f.conns.get(addr)
	if err != nil {
		return nil, false, csisupdv1.NewNoLeaderError(f.id, fmt.Sprintf("forward to the leader at %s: %v", addr, err))
	}
	return conn, false, nil
}

// forwardContext is the outgoing context of a request this server
// forwards to the leader: marked as forwarded, and carrying what the
// leader checks of the caller that only this server saw: the node secret
// an agent presented, and the node its token or certificate binds it to.
func forwardContext(ctx context.Context, id string) context.Context {
	kv := []string{forwardedKey, id}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, secret := range md.Get(csisupdv1.NodeSecretMetadataKey) {
			kv = append(kv, csisupdv1.NodeSecretMetadataKey, secret)
		}
	}
	return acl.AppendCallerNode(metadata.AppendToOutgoingContext(ctx, kv...), acl.CallerNodeFromContext(ctx))
}

// forwarded reports whether a follower forwarded the request of ctx.
func forwarded(ctx context.Context) bool {
	// Every leader-only call asks, so it reads the one key rather than
	// copying the whole metadata.
	return len(metadata.ValueFromIncomingContext(ctx, forwardedKey)) > 0
}

// answeredKey is the trailer a server sets on its answer to a forwarded
// request. The follower that forwarded it then knows that an Unavailable
// error without it is not the leader's answer but the loss of the leader:
// the connection failed or broke during the call.
const answeredKey = "csisupd-answered-by"

// markAnswered sets answeredKey on the answer to a request that was
// forwarded to this server.
func (f *forwarder) markAnswered(ctx context.Context) {
	// Fails only outside a gRPC handler, where nobody reads it.
	_ = grpc.SetTrailer(ctx, metadata.Pairs(answeredKey, f.id))
}

// markLeader names this server, the leader, on the error of a request it
// ran, for the caller to say who answered. Only errors carry it, so that
// the hot paths (heartbeats, claims) send nothing more.
func (f *forwarder) markLeader(ctx context.Context) {
	if f.leader != "" {
		// Fails only outside a gRPC handler, where nobody reads it.
		_ = grpc.SetTrailer(ctx, metadata.Pairs(csisupdv1.LeaderTrailerKey, f.leader))
	}
}

// passLeader passes the leader's name from the trailer of a forwarded
// request's error on to this server's caller.
func passLeader(ctx context.Context, trailer metadata.MD) {
	if v := trailer.Get(csisupdv1.LeaderTrailerKey); len(v) > 0 {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(csisupdv1.LeaderTrailerKey, v[0]))
	}
}

// notRunKey is the trailer a server sets when it refuses a forwarded
// request before running any of it (it is not the leader, or not ready
// yet): the follower that forwarded it may send it again.
const notRunKey = "csisupd-not-run"

// leaderClientConn is the connection a follower forwards one request to
// the leader on.
//
// A unary call that the leader refused before running it (notRunKey), or
// that never reached it, is sent again, to the leader of the moment,
// within the request's hold. A unary call that fails Unavailable, without
// details and without the leader's answeredKey, lost the leader (it died,
// stopped, or cannot be reached): its error becomes NoLeader, which
// callers know to retry, rather than a plain Unavailable that reads as a
// server the caller could not reach. Such a call may have run, so it is
// never sent again here. Streams pass through.
type leaderClientConn struct {
	conn *grpc.ClientConn
	// server is this server's id.
	server string
	// hold is the request's wait for a leader; resolve finds the leader
	// of the moment.
	hold    *leaderHold
	resolve func() (conn *grpc.ClientConn, electing bool, err error)
}

func (c leaderClientConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	for {
		var trailer metadata.MD
		err := c.conn.Invoke(ctx, method, args, reply, append(opts, grpc.Trailer(&trailer))...)
		if err == nil || ctx.Err() != nil {
			return err
		}
		passLeader(ctx, trailer)
		if notRun := len(trailer.Get(notRunKey)) > 0 || csisupdv1.NotReached(err); notRun && c.hold != nil {
			if conn, ok := c.next(ctx); ok {
				c.conn = conn
				continue
			}
		}
		if len(trailer.Get(answeredKey)) > 0 {
			return err
		}
		st := status.Convert(err)
		if st.Code() != codes.Unavailable || len(st.Details()) > 0 {
			return err
		}
		return csisupdv1.NewNoLeaderError(c.server, fmt.Sprintf("the leader at %s did not answer: %s", c.conn.Target(), st.Message()))
	}
}

// next waits within the hold for a leader to send a refused call to
// again, and reports false when the hold ends first.
func (c leaderClientConn) next(ctx context.Context) (*grpc.ClientConn, bool) {
	for c.hold.again(ctx) {
		conn, electing, err := c.resolve()
		if err == nil {
			return conn, true
		}
		if !electing {
			return nil, false
		}
	}
	return nil, false
}

func (c leaderClientConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return c.conn.NewStream(ctx, desc, method, opts...)
}

// consistentRead checks that this leader may serve a consistent read.
func (f *forwarder) consistentRead() error {
	done, err := f.node.BeginOp()
	if err != nil {
		return csisupdv1.NewNoLeaderError(f.id, "verify leadership: "+err.Error())
	}
	defer done()
	if err := f.node.Raft().VerifyLeader().Error(); err != nil {
		return csisupdv1.NewNoLeaderError(f.id, "verify leadership: "+err.Error())
	}
	return nil
}

// toStatus maps internal errors to gRPC status errors.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, state.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost),
		errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raftnode.ErrNoLeader):
		// This server lost the leadership during the call, or never had
		// it: typed, so that the caller retries (a volume request is
		// idempotent) rather than reading it as a server it could not
		// reach. The server's id is not known here; the message names
		// the condition.
		return csisupdv1.NewNoLeaderError("", err.Error())
	case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, raft.ErrEnqueueTimeout):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
