package registry

import (
	"context"
	"fmt"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
)

// firstFingerprintRetry is the delay before the second fingerprint attempt
// of a plugin; later attempts double it up to the probe interval.
const firstFingerprintRetry = 50 * time.Millisecond

// timing is how often a supervisor probes and fingerprints its plugin.
type timing struct {
	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	FingerprintInterval time.Duration
}

func (t timing) validate() error {
	if t.ProbeInterval <= 0 {
		return fmt.Errorf("probe interval must be positive, got %s", t.ProbeInterval)
	}
	if t.ProbeTimeout <= 0 || t.ProbeTimeout > t.ProbeInterval {
		return fmt.Errorf("probe timeout must be positive and at most the probe interval (%s), got %s", t.ProbeInterval, t.ProbeTimeout)
	}
	if t.FingerprintInterval <= 0 {
		return fmt.Errorf("fingerprint interval must be positive, got %s", t.FingerprintInterval)
	}
	return nil
}

// supervisorConfig configures the supervisor of one plugin instance.
type supervisorConfig struct {
	ID       string
	Instance SocketID
	Registry *Registry
	Timing   timing
	Logger   hclog.Logger
}

// supervisor runs one plugin instance: it fingerprints the plugin until it
// answers, registers it, probes it with a heartbeat.Monitor and
// fingerprints it again every FingerprintInterval and after every recovery.
// It is the only writer of its plugin's health.
//
// A supervisor costs one goroutine: the monitor's probe loop also does the
// refingerprinting, and a broken connection is reported by the connection
// itself (csiclient's OnDisconnect), not by a watcher goroutine. Thousands
// of plugins per node stay cheap.
type supervisor struct {
	id     string
	inst   SocketID
	reg    *Registry
	log    hclog.Logger
	client *csiclient.Client
	// fpClients share client's connection; their calls wait for it.
	fpClients fingerprint.Clients
	cancel    context.CancelFunc
	done      chan struct{} // closed when the supervisor's goroutine returned

	// Only the monitor's goroutine (onProbe) touches these two.
	lastState       heartbeat.State
	lastFingerprint time.Time // of the latest successful fingerprint

	closeOnce sync.Once

	mu     sync.Mutex
	timing timing
	mon    *heartbeat.Monitor // nil until the plugin is fingerprinted
}

// startSupervisor creates the plugin's connection (it dials lazily) and
// starts supervising until ctx ends or stop is called.
func startSupervisor(ctx context.Context, cfg supervisorConfig) (*supervisor, error) {
	s := &supervisor{}
	client, err := csiclient.New(csiclient.Config{
		Socket:       cfg.Instance.Path,
		MaxBackoff:   cfg.Timing.ProbeInterval,
		OnDisconnect: s.onDisconnect,
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
		reg:    cfg.Registry,
		log:    cfg.Logger,
		client: client,
		fpClients: fingerprint.Clients{
			Identity:   csi.NewIdentityClient(cc),
			Controller: csi.NewControllerClient(cc),
			Node:       csi.NewNodeClient(cc),
		},
		cancel:    cancel,
		done:      make(chan struct{}),
		lastState: heartbeat.Unknown,
		timing:    cfg.Timing,
	}
	go s.run(ctx)
	return s, nil
}

// signalStop asks the supervisor to stop without waiting.
func (s *supervisor) signalStop() { s.cancel() }

// wait waits until the supervisor stopped, then closes its connection.
func (s *supervisor) wait() {
	<-s.done
	s.closeOnce.Do(func() {
		if err := s.client.Close(); err != nil {
			s.log.Debug("closing plugin connection", "error", err)
		}
	})
}

// stop stops the supervisor and waits for it. It may be called again.
func (s *supervisor) stop() {
	s.signalStop()
	s.wait()
}

// setTiming applies new probe and fingerprint timing.
func (s *supervisor) setTiming(t timing) {
	s.mu.Lock()
	s.timing = t
	mon := s.mon
	s.mu.Unlock()
	if mon != nil {
		if err := mon.SetTiming(t.ProbeInterval, t.ProbeTimeout); err != nil {
			s.log.Error("cannot apply probe timing", "error", err)
		}
	}
}

// onDisconnect runs on gRPC's reader goroutine the moment the plugin's
// connection breaks: probe now instead of at the next interval.
func (s *supervisor) onDisconnect() {
	s.mu.Lock()
	mon := s.mon
	s.mu.Unlock()
	if mon != nil {
		mon.ProbeNow()
	}
}

func (s *supervisor) currentTiming() timing {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timing
}

func (s *supervisor) run(ctx context.Context) {
	defer close(s.done)
	if !s.fingerprintUntilAnswered(ctx) {
		return
	}
	s.lastFingerprint = time.Now()
	s.mu.Lock()
	t := s.timing
	mon, err := heartbeat.New(heartbeat.Config{
		Identity: csi.NewIdentityClient(s.client.Supervision()),
		Interval: t.ProbeInterval,
		Timeout:  t.ProbeTimeout,
		OnProbe:  func(h heartbeat.Health, transition bool) { s.onProbe(ctx, h, transition) },
		Logger:   s.log,
	})
	s.mon = mon
	s.mu.Unlock()
	if err != nil {
		// The timing is validated before it gets here.
		s.log.Error("cannot start probing", "error", err)
		return
	}
	mon.Run(ctx)
}

// fingerprintUntilAnswered fingerprints the plugin, retrying with a backoff
// capped at the probe interval, and registers it. When the first attempt
// fails the plugin is registered at once, unhealthy with the error, so an
// operator sees a socket that does not answer as CSI. It returns false when
// ctx ended first.
func (s *supervisor) fingerprintUntilAnswered(ctx context.Context) bool {
	delay := firstFingerprintRetry
	var since time.Time
	for attempt := 1; ; attempt++ {
		fp, err := s.fingerprint(ctx)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			s.reg.Register(s.id, s.inst, &fp)
			s.log.Info("plugin fingerprinted", "socket", s.inst.Path, "type", string(fp.Type),
				"vendor", fp.VendorName, "version", fp.VendorVersion, "node_id", fp.NodeID)
			return true
		}
		now := time.Now()
		if attempt == 1 {
			since = now
			s.reg.Register(s.id, s.inst, nil)
			s.log.Warn("plugin does not answer fingerprinting; retrying", "socket", s.inst.Path, "error", err)
		} else {
			s.log.Debug("fingerprint failed", "attempt", attempt, "error", err)
		}
		s.reg.SetHealth(s.id, s.inst, heartbeat.Health{
			State:       heartbeat.Unhealthy,
			Description: "fingerprint failed: " + err.Error(),
			Since:       since,
			LastProbe:   now,
		})

		delay = min(delay, s.currentTiming().ProbeInterval)
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
		}
		delay *= 2
	}
}

// fingerprint takes one fingerprint bounded by the probe timeout. Its calls
// wait for the connection to be ready: a plugin binds its socket a moment
// before it listens, and a refused first dial within the timeout is no
// reason to call it unhealthy.
func (s *supervisor) fingerprint(ctx context.Context) (fingerprint.Fingerprint, error) {
	ctx, cancel := context.WithTimeout(ctx, s.currentTiming().ProbeTimeout)
	defer cancel()
	return fingerprint.Take(ctx, s.fpClients)
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

// onProbe records a probe result, then fingerprints a healthy plugin again
// when it just recovered (it may have been upgraded in place) or when the
// fingerprint interval has passed. A failed fingerprint is retried at the
// next probe.
func (s *supervisor) onProbe(ctx context.Context, h heartbeat.Health, transition bool) {
	s.reg.SetHealth(s.id, s.inst, h)
	recovered := transition && h.State == heartbeat.Healthy && s.lastState == heartbeat.Unhealthy
	s.lastState = h.State
	if h.State != heartbeat.Healthy {
		return
	}
	if !recovered && time.Since(s.lastFingerprint) < s.currentTiming().FingerprintInterval {
		return
	}
	fp, err := s.fingerprint(ctx)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		s.log.Warn("fingerprint failed; retrying at the next probe", "socket", s.inst.Path, "error", err)
	default:
		s.lastFingerprint = time.Now()
		s.reg.SetFingerprint(s.id, s.inst, fp)
	}
}
