package tlsutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults of ListenerConfig.
const (
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxPending       = 64
)

// Bounds of the pause after a failed accept of the inner listener.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// ListenerConfig configures NewListener.
type ListenerConfig struct {
	// TLS is the server configuration of the handshakes, normally
	// Configurator.IncomingConfig(). Required.
	TLS *tls.Config
	// Region is the region of the role names; "" means DefaultRegion.
	Region string
	// RequireRole is the role every peer must carry (PeerRole); "" accepts
	// any peer with a verified certificate. The raft port requires
	// RoleServer.
	RequireRole Role
	// HandshakeTimeout bounds each handshake; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections in a handshake, or handshaken and
	// waiting for Accept, at once; 0 means DefaultMaxPending. A connection
	// beyond it is closed at once and logged.
	MaxPending int
	// Logger receives a warning for every refused connection.
	Logger hclog.Logger
}

// listener is the net.Listener of NewListener.
type listener struct {
	inner net.Listener
	cfg   ListenerConfig

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	conns  chan *tls.Conn
	slots  chan struct{} // one per connection in a handshake or waiting for Accept
	wg     sync.WaitGroup

	// failed is closed when the inner listener failed for good; err says
	// why.
	failed chan struct{}
	err    error

	closeOnce sync.Once
	closeErr  error
}

// NewListener returns a listener that accepts raw connections from inner
// in a goroutine of its own, and handshakes each in another goroutine,
// within HandshakeTimeout. A connection that is not TLS (plain raft bytes,
// an HTTP/2 preface), fails the handshake or the verification of its
// certificate, presents no verified certificate, or carries a role other
// than RequireRole is closed and logged at Warn with the remote address
// and the reason. Accept returns the others, as *tls.Conn, their handshake
// done. Close closes inner, stops every goroutine and waits for them;
// Accept then returns net.ErrClosed.
func NewListener(inner net.Listener, cfg ListenerConfig) net.Listener {
	if cfg.TLS == nil {
		panic("tlsutil.NewListener: ListenerConfig.TLS is nil")
	}
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		inner:  inner,
		cfg:    cfg,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(chan *tls.Conn),
		slots:  make(chan struct{}, cfg.MaxPending),
		failed: make(chan struct{}),
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Accept returns the next connection whose handshake and checks passed.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	case <-l.failed:
		return nil, l.err
	}
}

// Close closes the inner listener and every connection not yet accepted,
// and returns once every goroutine of the listener ended.
func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		l.closeErr = l.inner.Close()
		l.wg.Wait()
	})
	return l.closeErr
}

// Addr is the inner listener's address.
func (l *listener) Addr() net.Addr { return l.inner.Addr() }

// acceptLoop accepts raw connections until the listener is closed or the
// inner listener fails for good. Other accept errors (too many open
// files) are logged and retried after a pause that doubles up to
// acceptRetryMax.
func (l *listener) acceptLoop() {
	defer l.wg.Done()
	var pause time.Duration
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			if errors.Is(err, net.ErrClosed) {
				l.err = fmt.Errorf("TLS listener %s: %w", l.inner.Addr(), err)
				close(l.failed)
				return
			}
			pause = min(max(2*pause, acceptRetryMin), acceptRetryMax)
			l.cfg.Logger.Warn("accepting a connection failed; retrying", "address", l.inner.Addr().String(), "error", err, "retry_in", pause)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-l.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		pause = 0
		select {
		case l.slots <- struct{}{}:
		default:
			l.refuse(raw, fmt.Sprintf("too many pending TLS handshakes (max_pending %d)", l.cfg.MaxPending))
			continue
		}
		l.wg.Add(1)
		go l.serve(raw)
	}
}

// serve handshakes one connection, checks its peer and hands it to Accept.
func (l *listener) serve(raw net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.slots }()
	conn, reason := l.handshake(raw)
	if conn == nil {
		if l.ctx.Err() != nil {
			_ = raw.Close() // the listener closed: not the peer's fault
			return
		}
		l.refuse(raw, reason)
		return
	}
	select {
	case l.conns <- conn:
	case <-l.ctx.Done():
		_ = conn.Close()
	}
}

// handshake runs the server handshake of raw within HandshakeTimeout and
// checks the peer's role. It returns the connection, or nil and why it was
// refused.
func (l *listener) handshake(raw net.Conn) (*tls.Conn, string) {
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.HandshakeTimeout)
	defer cancel()
	// The deadline bounds the handshake even where a context cannot reach
	// (a write blocked on a peer that does not read).
	_ = raw.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	conn := tls.Server(raw, l.cfg.TLS)
	if err := conn.HandshakeContext(ctx); err != nil {
		return nil, handshakeReason(err, l.cfg.HandshakeTimeout)
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Sprintf("clearing the handshake deadline: %v", err)
	}
	role, ok := PeerRole(conn.ConnectionState(), l.cfg.Region)
	switch {
	case !ok && l.cfg.RequireRole != "":
		return nil, fmt.Sprintf("no verified certificate, want role %s", l.cfg.RequireRole)
	case !ok:
		return nil, "no verified certificate"
	case l.cfg.RequireRole != "" && role != l.cfg.RequireRole:
		return nil, fmt.Sprintf("certificate role %s, want %s", role, l.cfg.RequireRole)
	}
	return conn, ""
}

// handshakeReason describes a failed handshake for the log.
func handshakeReason(err error, timeout time.Duration) string {
	var rh tls.RecordHeaderError
	var cv *tls.CertificateVerificationError
	switch {
	case errors.As(err, &rh):
		return "not TLS"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Sprintf("handshake timed out after %s", timeout)
	case errors.Is(err, io.EOF):
		return "closed by the peer during the handshake"
	case errors.As(err, &cv):
		return fmt.Sprintf("certificate verification failed: %v", cv.Err)
	}
	return fmt.Sprintf("handshake failed: %v", err)
}

// refuse closes a connection and logs why.
func (l *listener) refuse(c net.Conn, reason string) {
	_ = c.Close()
	l.cfg.Logger.Warn("refused a connection", "remote", c.RemoteAddr().String(), "reason", reason)
}
