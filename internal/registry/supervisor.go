package registry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
)

// timing is how often a supervisor probes and fingerprints its plugin.
type timing struct {
	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	FingerprintInterval time.Duration
}

func (t timing) validate() error {
	if err := heartbeat.ValidateTiming(t.ProbeInterval, t.ProbeTimeout); err != nil {
		return err
	}
	if t.FingerprintInterval <= 0 {
		return fmt.Errorf("fingerprint interval must be positive, got %s", t.FingerprintInterval)
	}
	return nil
}

// probeTiming is the one copy of the timing of a registry's plugins: the
// reconciler sets it (a configuration reload), and every supervisor and its
// monitor read it when they need it, so nothing holds a copy that a reload
// could miss.
type probeTiming struct{ v atomic.Pointer[timing] }

func newProbeTiming(t timing) *probeTiming {
	p := &probeTiming{}
	p.set(t)
	return p
}

func (p *probeTiming) get() timing  { return *p.v.Load() }
func (p *probeTiming) set(t timing) { p.v.Store(&t) }

// probe returns the probe interval and timeout, as heartbeat.Config.Timing.
func (p *probeTiming) probe() (interval, timeout time.Duration) {
	t := p.get()
	return t.ProbeInterval, t.ProbeTimeout
}

// supervisorConfig configures the supervisor of one plugin instance.
type supervisorConfig struct {
	ID       string
	Instance plugin.Instance
	// Expect is the plugin's declared type, or "": a plugin fingerprinted
	// as another type is recorded unhealthy, whatever its probes say.
	Expect   plugin.Type
	Registry *Registry
	Timing   *probeTiming // the registry's one copy
	// Probes runs the probes of the plugin's monitor, with every other
	// plugin's.
	Probes *heartbeat.Scheduler
	// Transport is the supervision transport shared by the plugins: its
	// write timeout and reply cap bound what a plugin can make the
	// supervisor wait for or read. Nil gives the plugin csiclient's
	// defaults.
	Transport *csiclient.Transport
	// Redial spaces the supervision connection's redials while a call
	// waits for the socket (csiclient.Config.Redial).
	Redial retry.Policy
	// DialOptions are added to the full gRPC connection
	// (csiclient.Config.DialOptions).
	DialOptions []grpc.DialOption
	// FingerprintRetry spaces the fingerprint attempts until the plugin
	// first answers; the probe interval caps it (see fingerprintRetry).
	FingerprintRetry retry.Policy
	Logger           hclog.Logger
}

// supervisor runs one plugin instance: it fingerprints the plugin until it
// answers, registers it, probes it with a heartbeat.Monitor and
// fingerprints it again every FingerprintInterval and after every recovery.
// It is the only writer of its plugin's health, until it is stopped: from
// then on nothing it learns reaches the registry (see beginStop).
//
// A plugin that violates the gRPC protocol is backed off: consecutive
// violations space its probes (through the monitor's Pace) and its
// fingerprints exponentially, up to maxViolationBackoff, and its health
// description says why.
//
// A supervisor costs a goroutine only until its plugin first answers
// fingerprinting: from then on the registry's probe scheduler runs its
// monitor, whose probes also do the refingerprinting, and a broken
// connection is reported by the connection itself (csiclient's
// OnDisconnect), not by a watcher goroutine. Thousands of plugins per node
// stay cheap. Stopping costs one goroutine more, briefly, to close the
// connection.
type supervisor struct {
	id     string
	inst   plugin.Instance
	expect plugin.Type
	reg    *Registry
	log    hclog.Logger
	client *csiclient.Client
	// fpClients share client's connection; their calls wait for it.
	fpClients fingerprint.Clients
	cancel    context.CancelFunc
	// done is closed when the supervisor's goroutine returned, and
	// monitorDone, once set, when its monitor left the probe scheduler.
	done        chan struct{}
	monitorDone <-chan struct{}
	// closed is closed when closeConn returned.
	closed chan struct{}
	// closeConn closes the plugin connection: client.Close, which tests
	// replace with one that hangs.
	closeConn func() error
	stopOnce  sync.Once

	// fenceMu orders the registry writes with beginStop: once fenced,
	// the supervisor writes nothing more, so an old instance that stops
	// slowly can never take its successor's record back (Register of a
	// known id with another instance takes the record over).
	fenceMu sync.Mutex
	fenced  bool

	// Only the supervisor's goroutine (run, and within the monitor onProbe
	// and pace) touches these. The plugin's health is not among them: it is
	// held by the registry record alone.
	lastFingerprint time.Time   // of the latest successful fingerprint
	fpType          plugin.Type // the type that fingerprint found
	refingerprint   bool        // a fingerprint is due (the plugin recovered)
	fpRetryAt       time.Time   // no fingerprint before then: backing off
	// fpViolation says why refingerprints of a healthy plugin are backed
	// off, for its health description; "" when they are not.
	fpViolation  string
	probeBackoff violationBackoff
	fpBackoff    violationBackoff
	fpRetry      retry.Policy // before the probe interval caps it

	// backingOff is set while probes are backed off for a protocol
	// violation; a broken connection then asks for no probe, which would
	// cut the backoff short. Read by csiclient's reader goroutine.
	backingOff atomic.Bool
	// connLost is set when the plugin's connection broke: the next
	// healthy probe is answered by a new connection, perhaps to a new
	// process, so it is fingerprinted again. Set by csiclient's reader
	// goroutine.
	connLost atomic.Bool

	timing *probeTiming // the registry's; read, never copied
	probes *heartbeat.Scheduler

	mu  sync.Mutex
	mon *heartbeat.Monitor // nil until the plugin is fingerprinted
}

// startSupervisor creates the plugin's connection (it dials lazily) and
// starts supervising until ctx ends or stop is called.
func startSupervisor(ctx context.Context, cfg supervisorConfig) (*supervisor, error) {
	s := &supervisor{}
	client, err := csiclient.New(csiclient.Config{
		Socket:       cfg.Instance.Path,
		MaxBackoff:   cfg.Timing.get().ProbeInterval,
		Redial:       cfg.Redial,
		OnDisconnect: s.onDisconnect,
		// ClientCSI's connection dials the path, which names whatever
		// socket is there now: one that reached a plugin instance which
		// replaced this one is refused, so calls allowed by this
		// instance's record never reach the new one. The new instance gets
		// a supervisor, a record and a connection of its own.
		CheckConnected: func() error { return checkInstance(cfg.Instance) },
		// Bounded replies and writes (the transport's limits): a plugin
		// that sends too much or stops reading must not hold the
		// supervisor.
		Transport:   cfg.Transport,
		DialOptions: cfg.DialOptions,
	})
	if err != nil {
		return nil, fmt.Errorf("plugin %q: %w", cfg.ID, err)
	}
	// Probes and fingerprints use the supervision connection: one cheap
	// HTTP/2 connection per plugin whose loss reports itself. ClientCSI
	// uses the client's full gRPC connection.
	cc := waitForReady{client.Supervision()}
	ctx, cancel := context.WithCancel(ctx)
	*s = supervisor{
		id:     cfg.ID,
		inst:   cfg.Instance,
		expect: cfg.Expect,
		reg:    cfg.Registry,
		log:    cfg.Logger,
		client: client,
		fpClients: fingerprint.Clients{
			Identity:   csi.NewIdentityClient(cc),
			Controller: csi.NewControllerClient(cc),
			Node:       csi.NewNodeClient(cc),
		},
		cancel:       cancel,
		done:         make(chan struct{}),
		closed:       make(chan struct{}),
		closeConn:    client.Close,
		probeBackoff: violationBackoff{what: "probe"},
		fpBackoff:    violationBackoff{what: "fingerprint"},
		fpRetry:      cfg.FingerprintRetry,
		timing:       cfg.Timing,
		probes:       cfg.Probes,
	}
	go s.run(ctx)
	return s, nil
}

// beginStop stops the supervisor without waiting for anything a plugin
// controls. It fences the supervisor's registry writes, closes the plugin
// connection first, so that calls blocked on the plugin (a write to a
// plugin that stopped reading) fail instead of waiting for it, then cancels
// the supervisor. The close runs on its own goroutine because it can block
// as well: the connection's lock may be held by the very write that is
// stuck. It may be called again.
func (s *supervisor) beginStop() {
	s.stopOnce.Do(func() {
		s.fenceMu.Lock()
		s.fenced = true
		s.fenceMu.Unlock()
		go func() {
			defer close(s.closed)
			if err := s.closeConn(); err != nil {
				s.log.Debug("closing plugin connection", "error", err)
			}
		}()
		s.cancel()
	})
}

// awaitStop waits until the supervisor's goroutine returned, its monitor
// left the probe scheduler and its connection is closed, or until
// deadline. It reports whether all happened.
func (s *supervisor) awaitStop(deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-s.done:
	case <-timer.C:
		return false
	}
	s.mu.Lock()
	monitorDone := s.monitorDone // set before done was closed, if ever
	s.mu.Unlock()
	for _, c := range []<-chan struct{}{monitorDone, s.closed} {
		if c == nil {
			continue
		}
		select {
		case <-c:
		case <-timer.C:
			return false
		}
	}
	return true
}

// write runs f, a registry write, unless the supervisor is stopping. It
// reports whether f ran.
func (s *supervisor) write(f func()) bool {
	s.fenceMu.Lock()
	defer s.fenceMu.Unlock()
	if s.fenced {
		return false
	}
	f()
	return true
}

// timingChanged probes at once after the registry's timing changed, so
// that a new interval starts now rather than after the current wait, and a
// new fingerprint interval is looked at now.
func (s *supervisor) timingChanged() {
	s.mu.Lock()
	mon := s.mon
	s.mu.Unlock()
	if mon != nil {
		mon.ProbeNow()
	}
}

// onDisconnect runs on gRPC's reader goroutine the moment the plugin's
// connection breaks: probe now instead of at the next interval, unless
// probes are backed off: the plugin is known to be broken, and probing it
// at once is what the backoff is there to prevent.
func (s *supervisor) onDisconnect() {
	// Whoever answers on the next connection may be another process (the
	// plugin restarted or was upgraded in place): fingerprint it again.
	s.connLost.Store(true)
	if s.backingOff.Load() {
		return
	}
	s.mu.Lock()
	mon := s.mon
	s.mu.Unlock()
	if mon != nil {
		mon.ProbeNow()
	}
}

func (s *supervisor) currentTiming() timing { return s.timing.get() }

func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	if !s.fingerprintUntilAnswered(ctx) {
		return
	}
	mon, err := heartbeat.New(heartbeat.Config{
		Identity: csi.NewIdentityClient(s.client.Supervision()),
		Timing:   s.timing.probe,
		OnProbe:  func(r heartbeat.Result) { s.onProbe(ctx, r) },
		Pace:     s.pace,
	})
	if err != nil {
		// The timing is validated before it gets here.
		s.log.Error("cannot start probing", "error", err)
		return
	}
	// From here on the monitor's probes, on the scheduler's goroutines,
	// are the only ones to touch the fields of the supervisor's goroutine;
	// Start orders them after what this goroutine did.
	s.mu.Lock()
	s.monitorDone = s.probes.Start(ctx, mon)
	s.mon = mon
	s.mu.Unlock()
}

// fingerprintUntilAnswered fingerprints the plugin, retrying with the
// jittered fingerprint retry backoff capped at the probe interval (longer
// for a plugin that violates the gRPC protocol), and registers it. When the
// first attempt fails the plugin is registered at once, unhealthy with the
// error, so an operator sees a socket that does not answer as CSI. It
// returns false when ctx ended first or the supervisor is stopping.
func (s *supervisor) fingerprintUntilAnswered(ctx context.Context) bool {
	var (
		retries  *retry.BackOff
		cappedAt time.Duration // the probe interval retries is capped at
	)
	for attempt := 1; ; attempt++ {
		fp, took, err := s.fingerprint(ctx)
		if ctx.Err() != nil {
			return false
		}
		interval := s.currentTiming().ProbeInterval
		if err == nil {
			s.lastFingerprint, s.fpType = time.Now(), fp.Type
			s.fpBackoff.observe(nil, interval)
			if !s.write(func() {
				s.reg.Register(s.id, s.inst, &fp)
				s.reg.fingerprinted(s.id, s.inst, took)
			}) {
				return false
			}
			s.log.Info("plugin fingerprinted", "socket", s.inst.Path, "type", string(fp.Type),
				"vendor", fp.VendorName, "version", fp.VendorVersion, "node_id", fp.NodeID)
			return true
		}
		wait, why := s.fpBackoff.observe(err, interval)
		desc := "fingerprint failed: " + err.Error()
		if why != "" {
			desc = "fingerprint failed: " + why
		} else {
			if retries == nil || cappedAt != interval {
				// First, or the timing was reloaded: a new cap.
				retries, cappedAt = fingerprintRetry(s.fpRetry, interval).NewBackOff(), interval
			}
			wait = retries.NextBackOff()
		}
		now := time.Now()
		switch {
		case attempt == 1:
			if !s.write(func() { s.reg.Register(s.id, s.inst, nil) }) {
				return false
			}
			s.log.Warn("plugin does not answer fingerprinting; retrying", "socket", s.inst.Path, "error", err)
		case why != "":
			// Bounded by the backoff: at most one line per wait.
			s.log.Warn("plugin violates the gRPC protocol; backing off fingerprints", "socket", s.inst.Path,
				"violations", s.fpBackoff.violations(), "next_attempt", wait, "error", err)
		default:
			s.log.Debug("fingerprint failed", "attempt", attempt, "error", err)
		}
		// Since stays at the first failure: the state does not change.
		// The attempt is timed once the plugin is registered (attempt 1
		// registered it above), as the metrics' series are kept only for
		// registered plugins.
		if !s.write(func() {
			s.reg.SetHealth(s.id, s.inst, heartbeat.Result{State: heartbeat.Unhealthy, Description: desc, At: now})
			s.reg.fingerprinted(s.id, s.inst, took)
		}) {
			return false
		}

		if retry.Wait(ctx, wait) != nil {
			return false
		}
	}
}

// typeMismatch returns why the plugin's fingerprinted type is not its
// declared one, or "" when it is, or nothing is declared or known.
func (s *supervisor) typeMismatch() string {
	if s.expect == "" || s.fpType == "" || s.fpType == s.expect {
		return ""
	}
	return fmt.Sprintf("declared type %q, but the plugin's fingerprinted type is %q: "+
		"fix the plugin block's type, or run the plugin the declaration describes", s.expect, s.fpType.OrUnknown())
}

// fingerprintRetry is the fingerprint retry policy p under the probe
// interval in force: the interval is its cap, and its base when shorter
// than p's, so that a plugin that does not answer fingerprinting is tried
// about as often as it would be probed, and never waits longer than the
// interval before jitter.
func fingerprintRetry(p retry.Policy, interval time.Duration) retry.Policy {
	p.Cap = interval
	p.Base = min(p.Base, interval)
	return p
}

// fingerprint takes one fingerprint bounded by the probe timeout and
// returns how long it took. Its calls wait for the connection to be ready:
// a plugin binds its socket a moment before it listens, and a refused
// first dial within the timeout is no reason to call it unhealthy.
func (s *supervisor) fingerprint(ctx context.Context) (fingerprint.Fingerprint, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.currentTiming().ProbeTimeout)
	defer cancel()
	start := time.Now()
	fp, err := fingerprint.Take(ctx, s.fpClients)
	return fp, time.Since(start), err
}

// errSocketReplaced fails a connection that reached another socket than the
// supervised instance's.
var errSocketReplaced = errors.New("socket replaced by another plugin instance")

// checkInstance reports whether the socket at inst.Path is still inst.
func checkInstance(inst plugin.Instance) error {
	now, reason, err := lstatSocket(inst.Path)
	switch {
	case err != nil:
		return fmt.Errorf("socket %s: %w", inst.Path, err)
	case reason != "":
		return fmt.Errorf("socket %s: %s", inst.Path, reason)
	case now != inst:
		return fmt.Errorf("%s: %w (inode %d, supervising inode %d)", inst.Path, errSocketReplaced, now.Inode, inst.Inode)
	}
	return nil
}

// waitForReady is a connection whose calls wait, within their deadline, for
// the connection to become ready instead of failing while it dials.
type waitForReady struct{ grpc.ClientConnInterface }

// Invoke implements grpc.ClientConnInterface.
func (w waitForReady) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return w.ClientConnInterface.Invoke(ctx, method, args, reply, append(opts, grpc.WaitForReady(true))...)
}

// NewStream implements grpc.ClientConnInterface.
func (w waitForReady) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return w.ClientConnInterface.NewStream(ctx, desc, method, append(opts, grpc.WaitForReady(true))...)
}

// pace is the monitor's Pace: it backs probes off while they keep
// violating the gRPC protocol and lets the monitor's interval rule
// otherwise.
func (s *supervisor) pace(err error, interval time.Duration) heartbeat.Pace {
	wait, why := s.probeBackoff.observe(err, interval)
	s.backingOff.Store(why != "")
	if why == "" {
		return heartbeat.Pace{}
	}
	// Bounded by the backoff: at most one line per wait.
	s.log.Warn("plugin violates the gRPC protocol; backing off probes", "socket", s.inst.Path,
		"violations", s.probeBackoff.violations(), "next_probe", wait, "error", err)
	return heartbeat.Pace{Wait: wait, Backoff: true, Description: why}
}

// onProbe records a probe result, then fingerprints a healthy plugin again
// when it recovered without a fingerprint since it failed, or answered on a
// new connection (either way it may be a new process, upgraded in place),
// or when the fingerprint interval has passed. A failed fingerprint is
// retried at the next probe; one that violated the gRPC protocol when its
// backoff ends, and until then the healthy plugin's description says so.
func (s *supervisor) onProbe(ctx context.Context, h heartbeat.Result) {
	prev, ok := s.setHealth(h, true)
	if !ok {
		return
	}
	if prev.State != h.State {
		s.log.Debug("health changed", "state", string(h.State), "description", h.Description)
	}
	if h.State == heartbeat.Healthy && prev.State == heartbeat.Unhealthy && !s.lastFingerprint.After(prev.Since) {
		s.refingerprint = true
	}
	if h.State == heartbeat.Healthy && s.connLost.Swap(false) {
		s.refingerprint = true
	}
	if h.State != heartbeat.Healthy {
		return
	}
	t := s.currentTiming()
	now := time.Now()
	if !s.refingerprint && now.Sub(s.lastFingerprint) < t.FingerprintInterval {
		return
	}
	if now.Before(s.fpRetryAt) {
		return
	}
	fp, took, err := s.fingerprint(ctx)
	if ctx.Err() == nil {
		s.write(func() { s.reg.fingerprinted(s.id, s.inst, took) })
	}
	switch {
	case ctx.Err() != nil:
	case err != nil:
		wait, why := s.fpBackoff.observe(err, t.ProbeInterval)
		if why == "" {
			s.log.Warn("fingerprint failed; retrying at the next probe", "socket", s.inst.Path, "error", err)
			if s.fpViolation != "" {
				// The series of violations ended.
				s.fpViolation = ""
				s.setHealth(h, false)
			}
			return
		}
		s.fpRetryAt = time.Now().Add(wait)
		s.fpViolation = why
		s.setHealth(h, false)
		s.log.Warn("plugin violates the gRPC protocol; backing off fingerprints", "socket", s.inst.Path,
			"violations", s.fpBackoff.violations(), "next_attempt", wait, "error", err)
	default:
		s.fpBackoff.observe(nil, t.ProbeInterval)
		s.fpRetryAt = time.Time{}
		s.refingerprint = false
		s.lastFingerprint = time.Now()
		typeWas := s.typeMismatch()
		s.fpType = fp.Type
		s.write(func() { s.reg.SetFingerprint(s.id, s.inst, fp) })
		if s.fpViolation != "" || s.typeMismatch() != typeWas {
			s.fpViolation = ""
			s.setHealth(h, false)
		}
	}
}

// setHealth records the probe result h, with a healthy plugin's
// description saying why its fingerprints are backed off, if they are: its
// recorded fingerprint may be stale. newProbe is true the first time h is
// recorded, which also counts the probe in the metrics; false when h is
// recorded again for a new description. It returns the health before h,
// and false when the supervisor is stopping or no longer the plugin's.
func (s *supervisor) setHealth(h heartbeat.Result, newProbe bool) (prev heartbeat.Health, ok bool) {
	if h.State == heartbeat.Healthy && s.fpViolation != "" {
		h.Description = "healthy, but fingerprint failed: " + s.fpViolation
	}
	if why := s.typeMismatch(); why != "" && h.State == heartbeat.Healthy {
		h.State, h.Description = heartbeat.Unhealthy, why
	}
	s.write(func() {
		if newProbe {
			prev, ok = s.reg.probed(s.id, s.inst, h)
		} else {
			prev, ok = s.reg.SetHealth(s.id, s.inst, h)
		}
	})
	return prev, ok
}
