package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/kubeletreg"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
)

// registrationSuffix ends a registration socket's name in kubelet's
// registration directory: node-driver-registrar creates <driver>-reg.sock,
// and kubelet looks at every socket there.
const registrationSuffix = ".sock"

// MaxRegistrationCalls caps the calls to registration sockets in flight at
// once (GetInfo and NotifyRegistrationStatus, all sockets together): a
// directory full of registrars that hang costs this many connections at
// most, whatever their number. A call waits for a free slot, bounded by
// its handler's life.
const MaxRegistrationCalls = 64

// maxRegistrationWait caps the wait between two GetInfo attempts at one
// registration socket that does not answer, or answers garbage.
const maxRegistrationWait = time.Minute

// notifyAttempts bounds the NotifyRegistrationStatus attempts for one
// registration: a registrar that cannot be told is left alone; it keeps
// waiting, as it would for a kubelet that never answered.
const notifyAttempts = 5

// kubeletConfig configures the kubelet registration handler.
type kubeletConfig struct {
	// Dir is kubelet's plugin registration directory.
	Dir      string
	Registry *Registry
	Trust    trustPolicy
	// CallTimeout bounds one GetInfo or NotifyRegistrationStatus call.
	CallTimeout time.Duration
	// Retry spaces the GetInfo attempts of a registrar that does not
	// answer (yet), or answers garbage, per socket, each wait capped at
	// maxRegistrationWait; and the notification attempts.
	Retry retry.Policy
	// EndpointDirs are the directories an endpoint may lie in
	// (client.kubelet_endpoint_dirs); a registration naming an endpoint
	// elsewhere is refused.
	EndpointDirs []string
	// Redial spaces the dials of a socket's first attempt, within
	// CallTimeout, while the socket refuses connections: a registrar's
	// socket appears at bind(2), a moment before it listens
	// (ManagerConfig.PluginRedial). Later attempts dial once: a socket
	// nobody listens on for that long is a stale file.
	Redial retry.Policy
	// Poke asks the watcher for a scan: a registration was accepted or
	// refused.
	Poke   func()
	Logger hclog.Logger
}

// registrations runs kubelet's side of the plugin registration protocol,
// after kubelet's plugin watcher: every registration socket in Dir gets a
// handler that asks it for the driver's name and CSI endpoint (GetInfo),
// checks them (kubeletreg.Check), and then tells the registrar the outcome
// (NotifyRegistrationStatus): false with the reason when it is refused or
// another source holds its plugin id, true once the plugin at the endpoint
// has been fingerprinted. An accepted registration claims the driver name
// as plugin id at the endpoint until its socket goes away; the plugin is
// then deregistered after the grace period like any other.
type registrations struct {
	cfg kubeletConfig
	log hclog.Logger

	wg    sync.WaitGroup // the handlers
	calls *callLimiter   // the calls in flight, at most MaxRegistrationCalls
	// onRetry, when set (by tests), is called before every wait between
	// two GetInfo attempts.
	onRetry func(path string, wait time.Duration)

	mu   sync.Mutex
	regs map[string]*registration // by registration socket path
}

// registration is one registration socket instance and what its handler
// learnt.
type registration struct {
	inst   plugin.Instance
	cancel context.CancelFunc
	// lost receives why the registration lost its plugin id to another
	// source; buffered, sent at most once.
	lost     chan string
	lostSent bool

	// Set by the handler, under registrations.mu.
	id, endpoint string // once accepted
	refused      string // once refused
	// tried is set once the first GetInfo failed, or its answer was
	// accepted or refused: never between an answer and its outcome, so
	// that the first desired state holds the registration's claim.
	tried bool
}

func newRegistrations(cfg kubeletConfig) *registrations {
	return &registrations{cfg: cfg, log: cfg.Logger, calls: newCallLimiter(MaxRegistrationCalls), regs: make(map[string]*registration)}
}

// scan reads the registration directory: the registration sockets in it,
// by path, the entries it ignores and those it refuses as untrusted. Dot
// files are skipped, as kubelet skips them.
func (k *registrations) scan() (found map[string]plugin.Instance, ignored []plugin.Ignored, refused []refusal, err error) {
	entries, err := os.ReadDir(k.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]plugin.Instance{}, nil, nil, nil
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read kubelet registration directory %q: %w", k.cfg.Dir, err)
	}
	found = make(map[string]plugin.Instance)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, registrationSuffix) {
			continue
		}
		path := filepath.Join(k.cfg.Dir, name)
		id := strings.TrimSuffix(strings.TrimSuffix(name, registrationSuffix), "-reg")
		si, reason, isRefused, err := k.cfg.Trust.inspectSocket(path, k.cfg.Dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			ignored = append(ignored, plugin.Ignored{Path: path, Reason: "cannot stat: " + err.Error()})
		case isRefused:
			ignored = append(ignored, plugin.Ignored{Path: path, Reason: reason})
			refused = append(refused, refusal{ID: id, Path: path, Reason: reason})
		case reason != "":
			ignored = append(ignored, plugin.Ignored{Path: path, Reason: reason})
		default:
			found[path] = si
		}
	}
	return found, ignored, refused, nil
}

// observe starts a handler for every registration socket of found that is
// new or was replaced, and stops those of sockets that went away.
func (k *registrations) observe(ctx context.Context, found map[string]plugin.Instance) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for path, reg := range k.regs {
		if inst, ok := found[path]; !ok || inst != reg.inst {
			reg.cancel()
			delete(k.regs, path)
			k.log.Info("kubelet registration socket removed", "socket", path, "plugin", reg.id)
		}
	}
	for path, inst := range found {
		if _, ok := k.regs[path]; ok {
			continue
		}
		hctx, cancel := context.WithCancel(ctx)
		reg := &registration{inst: inst, cancel: cancel, lost: make(chan string, 1)}
		k.regs[path] = reg
		k.log.Info("kubelet registration socket found", "socket", path)
		k.wg.Go(func() { k.handle(hctx, path, reg) })
	}
}

// claims returns the claims of the accepted registrations, the refused
// registrations as ignored entries, and whether a registration socket has
// no first outcome yet (see registration.tried). The watcher holds its
// first desired state back while one has none (within one call timeout),
// so that a restarted agent supervises the same socket as before from the
// start; pending is read with the claims, so that a claim accepted between
// the two is never missed.
func (k *registrations) claims() (claims []claim, ignored []plugin.Ignored, refused []refusal, pending bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for path, reg := range k.regs {
		pending = pending || !reg.tried
		switch {
		case reg.refused != "":
			ignored = append(ignored, plugin.Ignored{Path: path, Reason: "registration refused: " + reg.refused})
		case reg.id != "":
			c, r := k.cfg.Trust.namedClaim(sourceKubelet, reg.id, reg.endpoint)
			c.registration = path
			claims = append(claims, c)
			if r != nil {
				refused = append(refused, *r)
				ignored = append(ignored, plugin.Ignored{Path: r.Path, Reason: r.Reason})
			}
		}
	}
	return claims, ignored, refused, pending
}

// endpointDirs returns the directories of the accepted endpoints, for the
// watcher to watch: an endpoint socket may appear after its registration.
func (k *registrations) endpointDirs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var dirs []string
	for _, reg := range k.regs {
		if reg.endpoint != "" {
			dirs = append(dirs, filepath.Dir(reg.endpoint))
		}
	}
	return dirs
}

// lose refuses the registration at path, which lost its plugin id or its
// socket to another claim, and tells its registrar why, once. As kubelet
// does, it is not looked at again until its socket is replaced: a
// registrar told false exits and its restart creates a new socket.
func (k *registrations) lose(path, reason string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if reg, ok := k.regs[path]; ok && !reg.lostSent {
		reg.lostSent = true
		reg.refused = reason
		reg.lost <- reason
	}
}

// wait waits for every handler to return; each returns once its context
// ends, its calls bounded by CallTimeout.
func (k *registrations) wait() { k.wg.Wait() }

// handle runs one registration: GetInfo until it answers, the check, and
// the notification of the outcome.
func (k *registrations) handle(ctx context.Context, path string, reg *registration) {
	info, ok := k.getInfo(ctx, path, reg)
	if !ok {
		return
	}
	endpoint, err := kubeletreg.EndpointPath(info.Endpoint)
	if err == nil {
		// One socket, one spelling: the claim is compared by path.
		endpoint = filepath.Clean(endpoint)
		err = kubeletreg.Check(info)
	}
	if err == nil {
		err = k.checkEndpoint(endpoint)
	}
	if err != nil {
		k.log.Warn("kubelet registration refused", "socket", path, "driver", info.Name, "error", err)
		k.mu.Lock()
		reg.refused, reg.tried = err.Error(), true
		k.mu.Unlock()
		k.cfg.Poke()
		k.notify(ctx, path, false, err.Error())
		return
	}
	k.log.Info("kubelet registration passed its checks; claiming its endpoint", "socket", path,
		"plugin", info.Name, "endpoint", endpoint, "versions", info.SupportedVersions)
	sub := k.cfg.Registry.Subscribe()
	defer sub.Close()
	k.mu.Lock()
	reg.id, reg.endpoint, reg.tried = info.Name, endpoint, true
	k.mu.Unlock()
	k.cfg.Poke()
	for {
		select {
		case <-ctx.Done():
			return
		case reason := <-reg.lost:
			k.log.Warn("kubelet registration refused: another claim holds its plugin id or its socket", "socket", path, "plugin", info.Name, "reason", reason)
			k.notify(ctx, path, false, reason)
			return
		case <-sub.C():
			if p, ok := k.cfg.Registry.Get(info.Name); ok && p.Fingerprinted && p.Instance.Path == endpoint {
				k.notify(ctx, path, true, "")
				return
			}
		}
	}
}

// checkEndpoint refuses an endpoint outside EndpointDirs, and one the trust
// rules of a plugin socket refuse (a symlink on its path, an owner not
// allowed). An endpoint that does not exist yet passes: the driver may
// start after its registrar.
func (k *registrations) checkEndpoint(endpoint string) error {
	inside := slices.ContainsFunc(k.cfg.EndpointDirs, func(d string) bool {
		if within(endpoint, d) {
			return true
		}
		resolved, err := filepath.EvalSymlinks(d)
		return err == nil && within(endpoint, resolved)
	})
	if !inside {
		return fmt.Errorf("endpoint %s lies outside the directories allowed for kubelet-registered endpoints (%s); "+
			"set client.kubelet_endpoint_dirs to allow its directory", endpoint, strings.Join(k.cfg.EndpointDirs, ", "))
	}
	if _, why, refused := k.cfg.Trust.inspectNamedSocket(endpoint); refused {
		return fmt.Errorf("endpoint %s is not trusted: %s", endpoint, why)
	}
	return nil
}

// getInfo calls GetInfo until the registrar answers or ctx ends, each
// wait between two attempts growing up to maxRegistrationWait.
func (k *registrations) getInfo(ctx context.Context, path string, reg *registration) (kubeletreg.Info, bool) {
	backoff := k.cfg.Retry.NewBackOff()
	for attempt := 1; ; attempt++ {
		info, err := k.getInfoOnce(ctx, path, attempt == 1)
		if err == nil {
			return info, true
		}
		if ctx.Err() != nil {
			return kubeletreg.Info{}, false
		}
		if attempt == 1 {
			k.mu.Lock()
			reg.tried = true
			k.mu.Unlock()
			k.log.Warn("kubelet registration socket does not answer GetInfo; retrying", "socket", path, "error", err)
			k.cfg.Poke() // the first desired state need not wait for it
		}
		wait := registrationWait(backoff)
		if k.onRetry != nil {
			k.onRetry(path, wait)
		}
		if retry.Wait(ctx, wait) != nil {
			return kubeletreg.Info{}, false
		}
	}
}

// registrationWait is the next wait of b, capped at maxRegistrationWait.
func registrationWait(b *retry.BackOff) time.Duration {
	return min(b.NextBackOff(), maxRegistrationWait)
}

// getInfoOnce is one GetInfo attempt, in one of the MaxRegistrationCalls
// slots and bounded by CallTimeout once it has one. The first attempt
// (first) is redialled with the Redial backoff while the registrar
// refuses connections.
func (k *registrations) getInfoOnce(ctx context.Context, path string, first bool) (kubeletreg.Info, error) {
	release, err := k.calls.acquire(ctx)
	if err != nil {
		return kubeletreg.Info{}, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, k.cfg.CallTimeout)
	defer cancel()
	redial := k.cfg.Redial.NewBackOff()
	for {
		info, err := kubeletreg.GetInfo(ctx, path)
		if !first || !errors.Is(err, kubeletreg.ErrNotListening) || retry.Wait(ctx, redial.NextBackOff()) != nil {
			return info, err
		}
	}
}

// notify tells the registrar the outcome, retrying a few times.
func (k *registrations) notify(ctx context.Context, path string, registered bool, reason string) {
	backoff := k.cfg.Retry.NewBackOff()
	for attempt := 1; ; attempt++ {
		err := k.notifyOnce(ctx, path, registered, reason)
		if err == nil {
			k.log.Info("kubelet registrar notified", "socket", path, "registered", registered)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if attempt == notifyAttempts {
			k.log.Warn("cannot notify the kubelet registrar; giving up", "socket", path, "registered", registered, "error", err)
			return
		}
		if retry.Wait(ctx, backoff.NextBackOff()) != nil {
			return
		}
	}
}

// notifyOnce is one NotifyRegistrationStatus attempt, in one of the
// MaxRegistrationCalls slots and bounded by CallTimeout once it has one.
func (k *registrations) notifyOnce(ctx context.Context, path string, registered bool, reason string) error {
	release, err := k.calls.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, k.cfg.CallTimeout)
	defer cancel()
	return kubeletreg.Notify(ctx, path, registered, reason)
}

// callLimiter bounds the calls in flight at once, and keeps the highest
// number it let run together.
type callLimiter struct {
	slots chan struct{}

	mu             sync.Mutex
	inFlight, peak int
}

func newCallLimiter(n int) *callLimiter { return &callLimiter{slots: make(chan struct{}, n)} }

// acquire waits for a free slot, or until ctx ends, and returns the
// function that frees it.
func (l *callLimiter) acquire(ctx context.Context) (release func(), err error) {
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l.mu.Lock()
	l.inFlight++
	l.peak = max(l.peak, l.inFlight)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.inFlight--
		l.mu.Unlock()
		<-l.slots
	}, nil
}

// counts returns the calls in flight now and the most there ever were.
func (l *callLimiter) counts() (inFlight, peak int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.inFlight, l.peak
}
