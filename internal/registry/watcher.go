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
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// SocketName is the socket file name inside a plugin's own directory:
// <plugin_dir>/<id>/csi.sock.
const SocketName = "csi.sock"

// SocketSuffix ends a socket placed directly in the plugin directory:
// <plugin_dir>/<id>.sock.
const SocketSuffix = ".sock"

// minCoalesce is the shortest time between two event-driven scans after a
// scan that found a new socket. After every scan the watcher waits at
// least twice as long as that scan took before the next one, so that it
// spends at most a third of its time scanning; after one that found a new
// socket, at least minCoalesce too: a burst of plugins starting at once
// then costs a few scans. A scan that found none (a plugin's directory
// made before its socket, a plugin gone) earns no more than its own cost,
// so the socket that follows is seen at once.
const minCoalesce = 2 * time.Millisecond

// desiredState is the result of one scan of the plugin directory.
type desiredState struct {
	// Sockets maps plugin id to the identity of its socket.
	Sockets map[string]plugin.Instance
	// Ignored lists entries that are not supervised, sorted by path.
	Ignored []plugin.Ignored
	// Refused are the entries of Ignored that are not trusted (see
	// trustPolicy), with their plugin id, sorted by path. Each is
	// reported by a plugin-socket-ignored event.
	Refused []refusal
	// TopProblem is why the plugin directory itself is not trusted, or
	// "". While it is set no socket in it is dialled.
	TopProblem string
	// Expect maps a declared plugin's id to the type it must have.
	Expect map[string]plugin.Type
	// Shadowed are the <id>.sock sockets not supervised because an
	// <id>/csi.sock exists too, by id; each is listed in Ignored. One that
	// holds its plugin id still claims it (see addClaims).
	Shadowed map[string]plugin.Instance
}

// refusal is a candidate plugin socket, or plugin subdirectory, that is not
// dialled because it is not trusted.
type refusal struct {
	ID, Path, Reason string
}

// scanPluginDir reads dir once (readdir, plus one lstat per candidate
// socket and per plugin subdirectory, plus one stat of dir) and returns the
// desired set. Entries that pol does not trust are ignored and listed as
// refused. watchSubdir is called for every plugin subdirectory before the
// socket inside it is looked at, so a socket created right after the look
// still produces a file system event.
func scanPluginDir(dir string, pol trustPolicy, watchSubdir func(path string)) (desiredState, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return desiredState{}, fmt.Errorf("read plugin directory %q: %w", dir, err)
	}
	st := desiredState{Sockets: make(map[string]plugin.Instance), Shadowed: make(map[string]plugin.Instance)}
	ignore := func(path, reason string) {
		st.Ignored = append(st.Ignored, plugin.Ignored{Path: path, Reason: reason})
	}
	refuse := func(id, path, reason string) {
		ignore(path, reason)
		st.Refused = append(st.Refused, refusal{ID: id, Path: path, Reason: reason})
	}
	// Sockets of the <id>.sock form, added after the <id>/csi.sock form
	// so that the latter wins when both exist.
	type flat struct {
		id string
		si plugin.Instance
	}
	var flats []flat
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		switch {
		case e.IsDir():
			sock := filepath.Join(path, SocketName)
			if watchSubdir != nil {
				watchSubdir(path)
			}
			if !ids.ValidPluginID(name) {
				// Only worth reporting once it holds a socket path.
				if _, err := os.Lstat(sock); err == nil {
					ignore(sock, invalidIDReason(name))
				}
				continue
			}
			fi, err := e.Info()
			switch {
			case errors.Is(err, fs.ErrNotExist):
				continue // removed since readdir
			case err != nil:
				ignore(path, "cannot stat: "+err.Error())
				continue
			}
			if reason := pol.subdirProblem(path, fi); reason != "" {
				refuse(name, path, reason)
				continue
			}
			si, reason, refused, err := pol.inspectSocket(sock, dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// A plugin directory whose socket is not there (yet).
			case err != nil:
				ignore(sock, "cannot stat: "+err.Error())
			case refused:
				refuse(name, sock, reason)
			case reason != "":
				ignore(sock, reason)
			default:
				st.Sockets[name] = si
			}
		case strings.HasSuffix(name, SocketSuffix):
			id := strings.TrimSuffix(name, SocketSuffix)
			if !ids.ValidPluginID(id) {
				ignore(path, invalidIDReason(id))
				continue
			}
			si, reason, refused, err := pol.inspectSocket(path, dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// Removed since readdir.
			case err != nil:
				ignore(path, "cannot stat: "+err.Error())
			case refused:
				refuse(id, path, reason)
			case reason != "":
				ignore(path, reason)
			default:
				flats = append(flats, flat{id: id, si: si})
			}
		case e.Type()&fs.ModeSymlink != 0 && ids.ValidPluginID(name):
			// A symlink as the <id> directory: never followed.
			refuse(name, path, symlinkReason(path, dir))
		default:
			ignore(path, fmt.Sprintf("not a plugin socket (%s): expected <id>%s or <id>/%s",
				describeMode(e.Type()), SocketSuffix, SocketName))
		}
	}
	for _, f := range flats {
		if prev, ok := st.Sockets[f.id]; ok {
			ignore(f.si.Path, fmt.Sprintf("duplicate plugin id %q: already served by %s", f.id, prev.Path))
			st.Shadowed[f.id] = f.si
			continue
		}
		st.Sockets[f.id] = f.si
	}
	if st.TopProblem = pol.topProblem(dir); st.TopProblem != "" {
		for id, si := range st.Sockets {
			refuse(id, si.Path, "the plugin directory is not trusted: "+st.TopProblem)
		}
		clear(st.Sockets)
	}
	slices.SortFunc(st.Ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) })
	st.Refused = sortedRefusals(st.Refused)
	return st, nil
}

func invalidIDReason(id string) string {
	return fmt.Sprintf("invalid plugin id %q: must match %s", id, ids.PluginIDPattern)
}

// lstatSocket returns the identity of the unix socket at path, or a reason
// why the file there is not one csisupd can connect to (a symlink is not
// one).
func lstatSocket(path string) (plugin.Instance, string, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return plugin.Instance{}, "", err
	}
	return socketOf(path, fi)
}

// inspectSocket is lstatSocket for a candidate socket of the plugin
// directory dir, with the trust checks: refused is true, with the reason,
// for a symlink and for a socket whose owner is not allowed.
func (p trustPolicy) inspectSocket(path, dir string) (si plugin.Instance, reason string, refused bool, err error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return plugin.Instance{}, "", false, err
	}
	if fi.Mode().Type() == fs.ModeSymlink {
		return plugin.Instance{}, symlinkReason(path, dir), true, nil
	}
	return p.trustedSocket(path, fi)
}

// trustedSocket is the identity of the socket at path that fi (from
// lstat, not a symlink) describes, or why it is not one csisupd can
// connect to, or a refusal with the reason when its owner is not allowed.
func (p trustPolicy) trustedSocket(path string, fi fs.FileInfo) (si plugin.Instance, reason string, refused bool, err error) {
	si, reason, err = socketOf(path, fi)
	if err != nil || reason != "" {
		return plugin.Instance{}, reason, false, err
	}
	if reason := p.socketProblem(fi); reason != "" {
		return plugin.Instance{}, reason, true, nil
	}
	return si, "", false, nil
}

// socketOf returns the identity of the unix socket at path that fi (from
// lstat) describes, or a reason why it is not one csisupd can connect to.
func socketOf(path string, fi fs.FileInfo) (plugin.Instance, string, error) {
	if fi.Mode().Type() != fs.ModeSocket {
		return plugin.Instance{}, fmt.Sprintf("not a unix socket (%s)", describeMode(fi.Mode().Type())), nil
	}
	if reason := socketPathProblem(path); reason != "" {
		return plugin.Instance{}, reason, nil
	}
	return socketIDOf(path, fi)
}

// unixSocketPathMax is the longest path a unix socket address holds:
// sun_path is 108 bytes on Linux, the last one a NUL.
const unixSocketPathMax = 107

// socketPathProblem returns why no connection can be made to a socket at
// path, or "". A plugin can bind such a socket (through a relative path,
// from its own working directory) that nobody can connect to by its full
// path: supervising it would only ever time out, so it is reported as
// ignored instead, with what to change.
func socketPathProblem(path string) string {
	err := csiclient.CheckSocketPath(path)
	if err == nil {
		return ""
	}
	if len(path) > unixSocketPathMax {
		return fmt.Sprintf("socket path too long: %d bytes, over the %d-byte limit of a unix socket address; "+
			"shorten the plugin directory or the plugin id", len(path), unixSocketPathMax)
	}
	return "unusable socket path: " + err.Error()
}

// socketIDOf builds a SocketID from the stat data of a socket file.
func socketIDOf(path string, fi fs.FileInfo) (plugin.Instance, string, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return plugin.Instance{}, "", fmt.Errorf("stat %q: no unix stat data", path)
	}
	return plugin.Instance{
		Path: path,
		// The conversions matter on platforms where these are not uint64.
		Dev:   uint64(st.Dev),
		Inode: uint64(st.Ino),
		Mtime: st.Mtim.Nano(),
	}, "", nil
}

// describeMode names a file type for ignore reasons.
func describeMode(t fs.FileMode) string {
	switch {
	case t == 0:
		return "regular file"
	case t&fs.ModeDir != 0:
		return "directory"
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeNamedPipe != 0:
		return "named pipe"
	case t&fs.ModeSocket != 0:
		return "unix socket"
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	default:
		return "irregular file"
	}
}

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
