package registry

import (
	"context"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestScanPluginDir(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		// wantSockets maps plugin id to its socket path relative to dir.
		wantSockets map[string]string
		// wantIgnored maps a path relative to dir to a part of its reason.
		wantIgnored map[string]string
		wantWatched []string
	}{
		{
			name:        "empty",
			setup:       func(*testing.T, string) {},
			wantSockets: map[string]string{},
		},
		{
			name: "both socket forms",
			setup: func(t *testing.T, dir string) {
				socketFile(t, filepath.Join(dir, "a", "csi.sock"))
				socketFile(t, filepath.Join(dir, "b.sock"))
			},
			wantSockets: map[string]string{"a": "a/csi.sock", "b": "b.sock"},
			wantWatched: []string{"a"},
		},
		{
			name: "dot names are skipped silently",
			setup: func(t *testing.T, dir string) {
				socketFile(t, filepath.Join(dir, ".hidden.sock"))
				socketFile(t, filepath.Join(dir, ".tmp", "csi.sock"))
				writeFile(t, filepath.Join(dir, ".lock"))
			},
			wantSockets: map[string]string{},
		},
		{
			name: "regular files at socket paths",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "c.sock"))
				writeFile(t, filepath.Join(dir, "d", "csi.sock"))
			},
			wantSockets: map[string]string{},
			wantIgnored: map[string]string{
				"c.sock":     "not a unix socket (regular file)",
				"d/csi.sock": "not a unix socket (regular file)",
			},
			wantWatched: []string{"d"},
		},
		{
			name: "a directory and a symlink at socket paths",
			setup: func(t *testing.T, dir string) {
				socketFile(t, filepath.Join(dir, "real", "csi.sock"))
				if err := os.Mkdir(filepath.Join(dir, "e.sock"), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(dir, "real", "csi.sock"), filepath.Join(dir, "f.sock")); err != nil {
					t.Fatal(err)
				}
			},
			wantSockets: map[string]string{"real": "real/csi.sock"},
			wantIgnored: map[string]string{"f.sock": "not a unix socket (symlink to "},
			wantWatched: []string{"e.sock", "real"},
		},
		{
			name: "invalid ids",
			setup: func(t *testing.T, dir string) {
				socketFile(t, filepath.Join(dir, "-bad.sock"))
				socketFile(t, filepath.Join(dir, "bad id", "csi.sock"))
				writeFile(t, filepath.Join(dir, strings.Repeat("x", 129)+".sock"))
				if err := os.Mkdir(filepath.Join(dir, "empty dir"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantSockets: map[string]string{},
			wantIgnored: map[string]string{
				"-bad.sock":                        `invalid plugin id "-bad"`,
				"bad id/csi.sock":                  `invalid plugin id "bad id"`,
				strings.Repeat("x", 129) + ".sock": "invalid plugin id",
			},
			wantWatched: []string{"bad id", "empty dir"},
		},
		{
			name: "plugin directory without its socket yet",
			setup: func(t *testing.T, dir string) {
				if err := os.Mkdir(filepath.Join(dir, "g"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantSockets: map[string]string{},
			wantWatched: []string{"g"},
		},
		{
			name: "duplicate id: the subdirectory form wins",
			setup: func(t *testing.T, dir string) {
				socketFile(t, filepath.Join(dir, "h", "csi.sock"))
				socketFile(t, filepath.Join(dir, "h.sock"))
			},
			wantSockets: map[string]string{"h": "h/csi.sock"},
			wantIgnored: map[string]string{"h.sock": `duplicate plugin id "h"`},
			wantWatched: []string{"h"},
		},
		{
			name: "socket paths too long to connect to",
			setup: func(t *testing.T, dir string) {
				listenUnixLong(t, filepath.Join(dir, "l"+strings.Repeat("x", 100)+".sock"))
				listenUnixLong(t, filepath.Join(dir, "m"+strings.Repeat("x", 100), "csi.sock"))
				socketFile(t, filepath.Join(dir, "short.sock"))
			},
			wantSockets: map[string]string{"short": "short.sock"},
			wantIgnored: map[string]string{
				"l" + strings.Repeat("x", 100) + ".sock":     "over the 107-byte limit of a unix socket address",
				"m" + strings.Repeat("x", 100) + "/csi.sock": "over the 107-byte limit of a unix socket address",
			},
			wantWatched: []string{"m" + strings.Repeat("x", 100)},
		},
		{
			name: "other entries",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "README"))
				socketFile(t, filepath.Join(dir, "nosuffix"))
			},
			wantSockets: map[string]string{},
			wantIgnored: map[string]string{
				"README":   "not a plugin socket (regular file)",
				"nosuffix": "not a plugin socket (unix socket)",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			tt.setup(t, dir)
			var watched []string
			st, err := scanPluginDir(dir, newTrustPolicy(nil, false), func(path string) {
				rel, _ := filepath.Rel(dir, path)
				watched = append(watched, rel)
			})
			if err != nil {
				t.Fatal(err)
			}
			got := make(map[string]string)
			for id, si := range st.Sockets {
				rel, _ := filepath.Rel(dir, si.Path)
				got[id] = rel
				if want := statSocket(t, si.Path); si != want {
					t.Errorf("socket %s: identity %+v, want %+v", id, si, want)
				}
			}
			if !maps.Equal(got, tt.wantSockets) {
				t.Errorf("sockets = %v, want %v", got, tt.wantSockets)
			}
			if len(st.Ignored) != len(tt.wantIgnored) {
				t.Errorf("ignored = %+v, want %d entries", st.Ignored, len(tt.wantIgnored))
			}
			for _, ig := range st.Ignored {
				rel, _ := filepath.Rel(dir, ig.Path)
				want, ok := tt.wantIgnored[rel]
				if !ok || !strings.Contains(ig.Reason, want) {
					t.Errorf("ignored %s: reason %q, want it to contain %q", rel, ig.Reason, want)
				}
			}
			if !slices.IsSortedFunc(st.Ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) }) {
				t.Errorf("ignored list is not sorted: %+v", st.Ignored)
			}
			slices.Sort(watched)
			if !slices.Equal(watched, tt.wantWatched) {
				t.Errorf("watched subdirectories = %v, want %v", watched, tt.wantWatched)
			}
		})
	}
}

func TestScanPluginDirMissing(t *testing.T) {
	_, err := scanPluginDir(filepath.Join(testutil.TempDir(t), "nope"), newTrustPolicy(nil, false), nil)
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("error = %v, want one naming the directory", err)
	}
}

// runWatcher starts a watcher on dir with a rescan period long enough that
// only file system events can explain what it sees.
func runWatcher(t *testing.T, dir string, reg *Registry) (*watcher, func()) {
	t.Helper()
	w, err := newWatcher(watcherConfig{Dir: dir, RescanInterval: time.Hour, Registry: reg,
		Trust: newTrustPolicy(nil, false), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx) })
	stop := func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(stop)
	return w, stop
}

// awaitState reads states from w until cond holds.
func awaitState(t *testing.T, w *watcher, what string, cond func(desiredState) bool) desiredState {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case st := <-w.updates():
			if cond(st) {
				return st
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestWatcherFollowsEvents(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "plugins") // created by the watcher
	reg := New(Config{})
	w, _ := runWatcher(t, dir, reg)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("plugin directory not created: %v", err)
	}
	awaitState(t, w, "initial empty state", func(st desiredState) bool { return len(st.Sockets) == 0 })

	// A plugin directory and its socket created right after it: the
	// socket may exist before the subdirectory is watched.
	socketFile(t, filepath.Join(dir, "a", "csi.sock"))
	socketFile(t, filepath.Join(dir, "b.sock"))
	st := awaitState(t, w, "sockets a and b", func(st desiredState) bool { return len(st.Sockets) == 2 })
	if st.Sockets["a"].Path != filepath.Join(dir, "a", "csi.sock") {
		t.Errorf("a = %+v", st.Sockets["a"])
	}

	// A socket appearing later in an already watched subdirectory: the
	// marker, ignored, shows a scan saw the subdirectory (and watched it).
	if err := os.Mkdir(filepath.Join(dir, "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "c-marker"))
	awaitState(t, w, "subdirectory c scanned", func(st desiredState) bool { return len(st.Ignored) == 1 })
	if err := os.Remove(filepath.Join(dir, "c-marker")); err != nil {
		t.Fatal(err)
	}
	socketFile(t, filepath.Join(dir, "c", "csi.sock"))
	awaitState(t, w, "socket c", func(st desiredState) bool {
		_, ok := st.Sockets["c"]
		return ok && len(st.Ignored) == 0
	})

	// Removal, and an ignored entry reaching the registry.
	if err := os.Remove(filepath.Join(dir, "a", "csi.sock")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "junk.sock"))
	awaitState(t, w, "a gone and junk.sock ignored", func(st desiredState) bool {
		_, ok := st.Sockets["a"]
		return !ok && len(st.Ignored) == 1
	})
	ign := reg.Ignored()
	if len(ign) != 1 || ign[0].Path != filepath.Join(dir, "junk.sock") || ign[0].Reason != "not a unix socket (regular file)" {
		t.Errorf("registry ignored = %+v", ign)
	}
}

func TestWatcherRecreatesRemovedPluginDir(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "plugins")
	w, _ := runWatcher(t, dir, New(Config{}))
	socketFile(t, filepath.Join(dir, "a.sock"))
	awaitState(t, w, "socket a", func(st desiredState) bool { return len(st.Sockets) == 1 })

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	awaitState(t, w, "no sockets", func(st desiredState) bool { return len(st.Sockets) == 0 })
	testutil.WaitFor(t, 10*time.Second, "plugin directory re-created", func() bool {
		fi, err := os.Stat(dir)
		return err == nil && fi.IsDir()
	})
	// Events from the new directory arrive: it is watched again.
	socketFile(t, filepath.Join(dir, "b", "csi.sock"))
	awaitState(t, w, "socket b", func(st desiredState) bool { _, ok := st.Sockets["b"]; return ok })
}

func TestWatcherCoalescesEventStorms(t *testing.T) {
	const n = 200
	dir := testutil.TempDir(t)
	w, stop := runWatcher(t, dir, New(Config{}))
	for i := range n {
		if i%2 == 0 {
			socketFile(t, filepath.Join(dir, fmt.Sprintf("p%03d.sock", i)))
		} else {
			socketFile(t, filepath.Join(dir, fmt.Sprintf("p%03d", i), "csi.sock"))
		}
	}
	awaitState(t, w, fmt.Sprintf("%d sockets", n), func(st desiredState) bool { return len(st.Sockets) == n })
	stop()
	// At least 1.5 events per socket arrived (the subdirectory form
	// makes two); one scan per event would be 300 or more.
	if w.scans >= n/2 {
		t.Errorf("%d scans for %d sockets created at once, want far fewer", w.scans, n)
	}
	t.Logf("%d scans for %d sockets", w.scans, n)
}

// TestScanReportsNewSockets checks what a scan reports to the coalescing
// of event-driven scans: only a socket that the previous scan did not find
// earns minCoalesce; a plugin's directory made before its socket, a scan
// that finds what the previous one found and a socket gone earn no wait.
func TestScanReportsNewSockets(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "plugins")
	w, err := newWatcher(watcherConfig{Dir: dir, RescanInterval: time.Hour, Registry: New(Config{}),
		Trust: newTrustPolicy(nil, false), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.fsw.Close() })
	sock := filepath.Join(dir, "a", "csi.sock")
	steps := []struct {
		name   string
		change func()
		want   bool
	}{
		{"empty directory", func() {}, false},
		{"plugin directory without a socket", func() {
			if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"socket created", func() { socketFile(t, sock) }, true},
		{"nothing changed", func() {}, false},
		{"socket removed", func() {
			if err := os.Remove(sock); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"socket created again", func() { socketFile(t, sock) }, true},
		{"second socket beside it", func() { socketFile(t, filepath.Join(dir, "b.sock")) }, true},
	}
	for _, step := range steps {
		step.change()
		if got := w.scan(); got != step.want {
			t.Errorf("%s: scan found a new socket = %v, want %v", step.name, got, step.want)
		}
	}
}
