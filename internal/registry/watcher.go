package registry

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// minCoalesce is the shortest time between two event-driven scans after a
// scan that found a new socket. After every scan the watcher waits at
// least twice as long as that scan took before the next one, so that it
// spends at most a third of its time scanning; after one that found a new
// socket, at least minCoalesce too: a burst of plugins starting at once
// then costs a few scans. A scan that found none (a plugin's directory
// made before its socket, a plugin gone) earns no more than its own cost,
// so the socket that follows is seen at once.
const minCoalesce = 2 * time.Millisecond

// watcherConfig configures a watcher.
type watcherConfig struct {
	// Dir is the plugin directory.
	Dir string
	// RescanInterval is the period of the backstop rescan.
	RescanInterval time.Duration
	// Registry receives the ignored entries of every scan, and the
	// plugin-socket-ignored events.
	Registry *Registry
	// Trust decides which entries may be dialled.
	Trust  trustPolicy
	Logger hclog.Logger
	// Watchdog, when set, gets the "plugin watcher" loop, beaten on every
	// turn of run.
	Watchdog *watchdog.Monitor
	// Kubelet, when set, handles kubelet's plugin registration directory:
	// every scan reads it too, and its accepted registrations are claims.
	Kubelet *registrations
	// InUse reports whether a plugin has volumes on this node
	// (ManagerConfig.InUse); nil means none has.
	InUse func(pluginID string) bool
}

// watcher turns the plugin directory into desired states. It watches the
// directory and every plugin subdirectory with fsnotify, scans once at
// start, after every burst of events, and every RescanInterval as a
// backstop against lost events. The latest state waits in a one-slot
// mailbox, so a slow reader only ever sees the newest one.
//
// The plugin directory is created (mode 0750) when it does not exist, at
// start and again when it is removed while running.
//
// Every entry the trust policy refuses is reported once by a
// plugin-socket-ignored event, and again when its reason changes (a new
// owner, a new symlink target) or after it was fixed and broke again.
type watcher struct {
	cfg    watcherConfig
	log    hclog.Logger
	fsw    *fsnotify.Watcher
	out    chan desiredState
	topOK  bool            // the plugin directory itself is watched
	subdir map[string]bool // watched plugin subdirectories
	scans  int             // number of scans, for tests
	// sockets are the sockets the latest scan found, by plugin id.
	sockets map[string]plugin.Instance
	// reported maps each refused path of the latest scan to the reason
	// its event gave; topProblem is the latest scan's TopProblem.
	reported   map[string]string
	topProblem string
	// extra are the watched directories outside the plugin directory:
	// those of declared sockets and kubelet endpoints (or their nearest
	// existing ancestor), and the kubelet registration directory.
	extra map[string]bool
	// poke asks for a scan: the declarations changed, or a kubelet
	// registration was answered.
	poke chan struct{}
	// conflicts maps each reported conflict (id and losing path) to its
	// description; shared holds the logged claims of one socket by two
	// sources.
	conflicts map[string]string
	shared    map[string]bool
	// ctx is run's, for the kubelet registration handlers.
	ctx context.Context
	// delivered is set once a desired state was delivered; started is
	// when run began.
	delivered bool
	started   time.Time
	// registrationsPending is the last scan's: a kubelet registration
	// had no first outcome yet when its claims were read.
	registrationsPending bool
}

// newWatcher creates the plugin directory when needed and starts
// watching it. Call run to scan and deliver, and it closes the watch.
func newWatcher(cfg watcherConfig) (*watcher, error) {
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch plugin directory %q: %w", cfg.Dir, err)
	}
	w := &watcher{
		cfg:       cfg,
		log:       cfg.Logger,
		fsw:       fsw,
		out:       make(chan desiredState, 1),
		subdir:    make(map[string]bool),
		reported:  make(map[string]string),
		extra:     make(map[string]bool),
		poke:      make(chan struct{}, 1),
		conflicts: make(map[string]string),
		shared:    make(map[string]bool),
		ctx:       context.Background(),
	}
	if err := w.watchTop(); err != nil {
		_ = fsw.Close()
		return nil, err
	}
	return w, nil
}

// requestScan asks for a scan soon (coalesced with file system events).
func (w *watcher) requestScan() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// updates delivers the latest desired state.
func (w *watcher) updates() <-chan desiredState { return w.out }

// watchTop creates the plugin directory when missing and watches it.
func (w *watcher) watchTop() error {
	if err := os.MkdirAll(w.cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("create plugin directory %q: %w", w.cfg.Dir, err)
	}
	if err := w.fsw.Add(w.cfg.Dir); err != nil {
		return fmt.Errorf("watch plugin directory %q: %w", w.cfg.Dir, err)
	}
	w.topOK = true
	return nil
}

// run scans at once and then after events and every RescanInterval, until
// ctx ends. It closes the file system watch before returning.
func (w *watcher) run(ctx context.Context) {
	defer func() { _ = w.fsw.Close() }()
	w.ctx, w.started = ctx, time.Now()
	l := w.cfg.Watchdog.Loop("plugin watcher")
	defer l.Done()

	// lastScan is when the latest scan ended; gap is the wait it earned.
	lastScan, gap := w.timedScan()

	rescan := time.NewTicker(w.cfg.RescanInterval)
	defer rescan.Stop()
	// While a claim is refused, a change of its holder (unhealthy,
	// deregistered) may free the id: the registry's changes are scanned.
	sub := w.cfg.Registry.Subscribe()
	defer sub.Close()
	// pending is stopped while no scan is scheduled. A lone event is
	// scanned at once (discovery latency is what users wait for); events
	// that follow within the gap a scan earned share one trailing scan.
	pending := time.NewTimer(minCoalesce)
	pending.Stop()
	armed := false
	schedule := func() {
		if armed {
			return
		}
		if since := time.Since(lastScan); since < gap {
			armed = true
			pending.Reset(gap - since)
			return
		}
		lastScan, gap = w.timedScan()
	}
	for {
		// Every turn ends here: a scan that hangs (a stuck file system)
		// stops the beats.
		l.Beat()
		select {
		case <-ctx.Done():
			pending.Stop()
			return
		case <-l.C():
			// Idle: the beat above is the turn.
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if ev.Name == w.cfg.Dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.topOK = false
			}
			if ev.Has(fsnotify.Remove | fsnotify.Rename) {
				// The kernel dropped the watch with the directory.
				delete(w.subdir, ev.Name)
				delete(w.extra, ev.Name)
			}
			schedule()
		case <-w.poke:
			schedule()
		case <-sub.C():
			if len(w.conflicts) > 0 {
				schedule()
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.log.Warn("file system events were lost; rescanning", "dir", w.cfg.Dir)
			} else {
				w.log.Warn("file system watch error; rescanning", "dir", w.cfg.Dir, "error", err)
			}
			schedule()
		case <-pending.C:
			armed = false
			lastScan, gap = w.timedScan()
		case <-rescan.C:
			w.scan()
		}
	}
}

// timedScan scans and returns when it ended and how long to wait before
// the next event-driven scan (see minCoalesce).
func (w *watcher) timedScan() (time.Time, time.Duration) {
	start := time.Now()
	found := w.scan()
	end := time.Now()
	gap := 2 * end.Sub(start)
	if found {
		gap = max(minCoalesce, gap)
	}
	return end, gap
}

// scan reads the plugin directory, updates the watches and the ignored
// list, and delivers the desired state. It reports whether it found a
// socket that the previous scan did not (new, or a new identity).
func (w *watcher) scan() (found bool) {
	w.scans++
	if !w.topOK {
		if err := w.watchTop(); err != nil {
			w.log.Error("plugin directory unavailable; retrying at the next rescan", "error", err)
			return false
		}
		w.log.Warn("plugin directory was removed; created it again", "dir", w.cfg.Dir)
	}
	seen := make(map[string]bool, len(w.subdir))
	start := time.Now()
	defer func() { w.cfg.Registry.metrics.scanned(time.Since(start)) }()
	st, err := scanPluginDir(w.cfg.Dir, w.cfg.Trust, func(path string) {
		seen[path] = true
		if w.subdir[path] {
			return
		}
		if err := w.fsw.Add(path); err != nil {
			// The periodic rescan still finds its socket.
			w.log.Warn("cannot watch plugin subdirectory", "dir", path, "error", err)
			return
		}
		w.subdir[path] = true
	})
	if errors.Is(err, fs.ErrNotExist) {
		// Removed between the watch and the read: every socket is gone.
		w.topOK = false
		st, err = desiredState{Sockets: map[string]plugin.Instance{}}, nil
	}
	if err != nil {
		// Keep the previous desired state rather than report every
		// plugin gone because of, say, a descriptor shortage.
		w.log.Error("cannot scan plugin directory; keeping the previous state", "error", err)
		return false
	}
	for id, inst := range st.Sockets {
		if prev, ok := w.sockets[id]; !ok || prev != inst {
			found = true
			break
		}
	}
	w.sockets = st.Sockets
	for path := range w.subdir {
		if !seen[path] {
			_ = w.fsw.Remove(path) // fails when the kernel already dropped it
			delete(w.subdir, path)
		}
	}
	w.addClaims(&st)
	w.cfg.Registry.SetIgnored(st.Ignored)
	w.report(st)
	if k := w.cfg.Kubelet; !w.delivered && k != nil && w.registrationsPending && time.Since(w.started) < k.cfg.CallTimeout {
		// The first state waits for the registrations found at start to
		// answer, or fail, once: else a plugin id that a registration
		// holds would be given to a socket of the plugin directory for a
		// moment. The handlers ask for the scan that delivers it.
		return found
	}
	w.delivered = true
	select {
	case <-w.out: // replace an unread state with the newer one
	default:
	}
	w.out <- st
	return found
}

// report logs a change of the plugin directory's own trust, and emits
// plugin-socket-ignored for every refused entry that is new or refused for
// a new reason since the previous scan: once per offending path, not once
// per scan.
func (w *watcher) report(st desiredState) {
	if st.TopProblem != w.topProblem {
		if st.TopProblem != "" {
			w.log.Error("plugin directory is not trusted; no socket in it is dialled until it is fixed",
				"dir", w.cfg.Dir, "problem", st.TopProblem)
		} else {
			w.log.Info("plugin directory is trusted again", "dir", w.cfg.Dir)
		}
		w.topProblem = st.TopProblem
	}
	next := make(map[string]string, len(st.Refused))
	for _, r := range st.Refused {
		next[r.Path] = r.Reason
		if prev, ok := w.reported[r.Path]; ok && prev == r.Reason {
			continue
		}
		w.log.Warn("plugin socket ignored: not trusted", "plugin", r.ID, "path", r.Path, "reason", r.Reason)
		w.cfg.Registry.socketIgnored(r.ID, r.Path, r.Reason)
	}
	w.reported = next
}
