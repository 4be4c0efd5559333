package registry

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// otherUID owns files "of another user" in the tests that need root to
// chown: nobody on most systems.
const otherUID = 65534

// chown gives path (not a symlink's target) to uid, or skips the test when
// it does not run as root: only root can give a file away.
func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving a file to another user needs root; run the tests as root to cover this case")
	}
	if err := os.Lchown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

// chmod sets path's mode exactly (no umask applies).
func chmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// symlink creates link pointing to target.
func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestOwnerAllowed(t *testing.T) {
	tests := []struct {
		name     string
		uid      uint32
		agentUID uint32
		owners   []uint32
		want     bool
	}{
		{"root, agent is root", 0, 0, nil, true},
		{"root, agent is another user", 0, 998, nil, true},
		{"the agent's user", 998, 998, nil, true},
		{"another user, no owners", 1000, 998, nil, false},
		{"another user, agent is root", 1000, 0, nil, false},
		{"a listed owner", 1000, 998, []uint32{1001, 1000}, true},
		{"not among the owners", 1002, 998, []uint32{1001, 1000}, false},
		{"nobody", otherUID, 0, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ownerAllowed(tt.uid, tt.agentUID, tt.owners); got != tt.want {
				t.Errorf("ownerAllowed(%d, %d, %v) = %v, want %v", tt.uid, tt.agentUID, tt.owners, got, tt.want)
			}
		})
	}
}

func TestDirProblems(t *testing.T) {
	tests := []struct {
		name     string
		mode     fs.FileMode
		uid      uint32
		agentUID uint32
		owners   []uint32
		want     []string // parts of each problem, in order
	}{
		{"0700 root", fs.ModeDir | 0o700, 0, 0, nil, nil},
		{"0750 root", fs.ModeDir | 0o750, 0, 0, nil, nil},
		{"0755 the agent's user", fs.ModeDir | 0o755, 998, 998, nil, nil},
		{"0770", fs.ModeDir | 0o770, 0, 0, nil, []string{"writable by its group"}},
		{"0757", fs.ModeDir | 0o757, 0, 0, nil, []string{"writable by others"}},
		{"1777 is no excuse for the directory itself", fs.ModeDir | fs.ModeSticky | 0o777, 0, 0, nil,
			[]string{"writable by its group", "writable by others"}},
		{"another owner", fs.ModeDir | 0o750, 4000000000, 4000000001, nil,
			[]string{"not owned by root (uid 0) or the agent's user uid 4000000001"}},
		{"a plugin owner", fs.ModeDir | 0o750, 4000000000, 4000000001, []uint32{4000000000}, nil},
		{"everything wrong", fs.ModeDir | 0o777, 4000000000, 0, nil,
			[]string{"writable by its group", "writable by others", "not owned by root (uid 0)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := dirProblems(tt.mode, tt.uid, tt.agentUID, tt.owners)
			if len(got) != len(tt.want) {
				t.Fatalf("dirProblems = %q, want %d problems like %q", got, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tt.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParentProblem(t *testing.T) {
	tests := []struct {
		mode fs.FileMode
		bad  bool
	}{
		{fs.ModeDir | 0o755, false},
		{fs.ModeDir | 0o775, false}, // group write bits of parents are not checked
		{fs.ModeDir | 0o777, true},
		{fs.ModeDir | 0o757, true},
		{fs.ModeDir | fs.ModeSticky | 0o777, false}, // /tmp
	}
	for _, tt := range tests {
		if got := parentProblem(tt.mode); (got != "") != tt.bad {
			t.Errorf("parentProblem(%s) = %q, want a problem: %v", tt.mode, got, tt.bad)
		}
	}
}

func TestAllowedOwners(t *testing.T) {
	tests := []struct {
		agentUID uint32
		owners   []uint32
		want     []string
	}{
		{0, nil, []string{"root (uid 0)"}},
		{4000000001, nil, []string{"root (uid 0) or the agent's user uid 4000000001"}},
		{0, []uint32{0, 4000000002}, []string{"root (uid 0) or uid 4000000002 from client.plugin_owners"}},
		{4000000001, []uint32{4000000002, 4000000003}, []string{
			"root (uid 0), the agent's user uid 4000000001, uid 4000000002 from client.plugin_owners or uid 4000000003 from client.plugin_owners"}},
	}
	for _, tt := range tests {
		got := allowedOwners(tt.agentUID, tt.owners)
		for _, w := range tt.want {
			if got != w {
				t.Errorf("allowedOwners(%d, %v) = %q, want %q", tt.agentUID, tt.owners, got, w)
			}
		}
	}
}

func TestCheckPluginDir(t *testing.T) {
	tests := []struct {
		name string
		// setup returns the plugin directory to check.
		setup func(t *testing.T, base string) string
		// want are parts of the error; none means no error.
		want   []string
		parent bool
	}{
		{
			name:  "private directory",
			setup: func(t *testing.T, base string) string { return base },
		},
		{
			name: "0750 and 0755 are fine",
			setup: func(t *testing.T, base string) string {
				dir := filepath.Join(base, "a", "plugins")
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				chmod(t, filepath.Dir(dir), 0o755)
				return dir
			},
		},
		{
			name: "world-writable",
			setup: func(t *testing.T, base string) string {
				chmod(t, base, 0o777)
				return base
			},
			want: []string{"plugin directory ", "mode drwxrwxrwx", "is writable by its group and writable by others", "fix: chmod go-w "},
		},
		{
			name: "group-writable",
			setup: func(t *testing.T, base string) string {
				chmod(t, base, 0o770)
				return base
			},
			want: []string{"mode drwxrwx---", "writable by its group", "fix: chmod go-w "},
		},
		{
			name: "parent writable by others",
			setup: func(t *testing.T, base string) string {
				dir := filepath.Join(base, "plugins")
				if err := os.Mkdir(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				chmod(t, base, 0o777)
				return dir
			},
			want:   []string{"parent directory ", "writable by others without the sticky bit", "fix: chmod o-w "},
			parent: true,
		},
		{
			name: "sticky parent writable by others",
			setup: func(t *testing.T, base string) string {
				dir := filepath.Join(base, "plugins")
				if err := os.Mkdir(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				chmod(t, base, fs.ModeSticky|0o777)
				return dir
			},
		},
		{
			name: "a symlinked plugin directory is checked where it resolves to",
			setup: func(t *testing.T, base string) string {
				open := filepath.Join(base, "open")
				real := filepath.Join(open, "plugins")
				if err := os.MkdirAll(real, 0o750); err != nil {
					t.Fatal(err)
				}
				chmod(t, open, 0o777)
				link := filepath.Join(base, "link")
				symlink(t, real, link)
				return link
			},
			want:   []string{"parent directory ", "/open of the plugin directory", "writable by others"},
			parent: true,
		},
		{
			name: "owned by another user",
			setup: func(t *testing.T, base string) string {
				dir := filepath.Join(base, "plugins")
				if err := os.Mkdir(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				chown(t, dir, otherUID)
				return dir
			},
			want: []string{"mode drwxr-x---", "uid 65534", "is not owned by root (uid 0)", "fix: chown "},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.setup(t, testutil.TempDir(t))
			err := CheckPluginDir(dir)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("CheckPluginDir(%s) = %v, want nil", dir, err)
				}
				return
			}
			var ue *UntrustedDirError
			if !errors.As(err, &ue) {
				t.Fatalf("CheckPluginDir(%s) = %v, want an *UntrustedDirError", dir, err)
			}
			if ue.Parent != tt.parent {
				t.Errorf("Parent = %v, want %v (%v)", ue.Parent, tt.parent, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), ue.Path) {
				t.Errorf("error %q does not name the path %s", err, ue.Path)
			}
		})
	}
}

func TestCheckPluginDirMissing(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "nope")
	err := CheckPluginDir(dir)
	if !errors.Is(err, fs.ErrNotExist) || errors.As(err, new(*UntrustedDirError)) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("CheckPluginDir of a missing directory = %v, want a not-exist error naming it", err)
	}
}

// The trust checks of a scan, on real directories and sockets.
func TestScanPluginDirTrust(t *testing.T) {
	tests := []struct {
		name   string
		owners []uint32
		// insecure turns the directory checks off.
		insecure bool
		setup    func(t *testing.T, dir, outside string)
		// wantSockets are the supervised ids.
		wantSockets []string
		// wantRefused maps a path relative to dir to parts of its reason.
		wantRefused map[string][]string
		wantTop     bool
	}{
		{
			name: "symlink <id>.sock to a socket outside",
			setup: func(t *testing.T, dir, outside string) {
				socketFile(t, filepath.Join(outside, "out.sock"))
				symlink(t, filepath.Join(outside, "out.sock"), filepath.Join(dir, "a.sock"))
			},
			wantRefused: map[string][]string{"a.sock": {
				"symlink to ", "out.sock", "outside the plugin directory", "never followed"}},
		},
		{
			name: "symlink <id>.sock to a socket inside is not followed either",
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "real.sock"))
				symlink(t, "real.sock", filepath.Join(dir, "b.sock"))
			},
			wantSockets: []string{"real"},
			wantRefused: map[string][]string{"b.sock": {`symlink to "real.sock"`, "inside the plugin directory", "never followed"}},
		},
		{
			name: "dangling symlink",
			setup: func(t *testing.T, dir, outside string) {
				symlink(t, filepath.Join(outside, "gone.sock"), filepath.Join(dir, "c.sock"))
			},
			wantRefused: map[string][]string{"c.sock": {"cannot be resolved", "never followed"}},
		},
		{
			name: "symlink <id>/csi.sock",
			setup: func(t *testing.T, dir, outside string) {
				socketFile(t, filepath.Join(outside, "out.sock"))
				symlink(t, filepath.Join(outside, "out.sock"), filepath.Join(dir, "d", SocketName))
			},
			wantRefused: map[string][]string{"d/csi.sock": {"outside the plugin directory", "never followed"}},
		},
		{
			name: "symlink <id> directory to a directory outside",
			setup: func(t *testing.T, dir, outside string) {
				socketFile(t, filepath.Join(outside, "e", SocketName))
				symlink(t, filepath.Join(outside, "e"), filepath.Join(dir, "e"))
			},
			wantRefused: map[string][]string{"e": {"outside the plugin directory", "never followed"}},
		},
		{
			name: "socket owned by another user",
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "f.sock"))
				chown(t, filepath.Join(dir, "f.sock"), otherUID)
				socketFile(t, filepath.Join(dir, "g", SocketName))
				chown(t, filepath.Join(dir, "g", SocketName), otherUID)
			},
			wantRefused: map[string][]string{
				"f.sock":     {"owned by ", "uid 65534", "allowed owners are root (uid 0)", "client.plugin_owners"},
				"g/csi.sock": {"uid 65534", "allowed owners are root (uid 0)"},
			},
		},
		{
			name:   "socket owned by a plugin owner",
			owners: []uint32{otherUID},
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "h.sock"))
				chown(t, filepath.Join(dir, "h.sock"), otherUID)
				socketFile(t, filepath.Join(dir, "i", SocketName))
				chown(t, filepath.Join(dir, "i"), otherUID)
				chown(t, filepath.Join(dir, "i", SocketName), otherUID)
			},
			wantSockets: []string{"h", "i"},
		},
		{
			name: "subdirectory owned by another user",
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "j", SocketName))
				chown(t, filepath.Join(dir, "j"), otherUID)
			},
			wantRefused: map[string][]string{"j": {"plugin subdirectory", "uid 65534", "fix: chown "}},
		},
		{
			name: "subdirectory writable by others",
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "k", SocketName))
				chmod(t, filepath.Join(dir, "k"), 0o777)
				socketFile(t, filepath.Join(dir, "ok", SocketName))
			},
			wantSockets: []string{"ok"},
			wantRefused: map[string][]string{"k": {"mode drwxrwxrwx", "writable by others", "chmod go-w "}},
		},
		{
			name:     "subdirectory writable by others, directory checks off",
			insecure: true,
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "k", SocketName))
				chmod(t, filepath.Join(dir, "k"), 0o777)
			},
			wantSockets: []string{"k"},
		},
		{
			name:     "directory checks off still refuse symlinks",
			insecure: true,
			setup: func(t *testing.T, dir, outside string) {
				socketFile(t, filepath.Join(outside, "out.sock"))
				symlink(t, filepath.Join(outside, "out.sock"), filepath.Join(dir, "a.sock"))
			},
			wantRefused: map[string][]string{"a.sock": {"never followed"}},
		},
		{
			name: "plugin directory writable by others",
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "l.sock"))
				socketFile(t, filepath.Join(dir, "m", SocketName))
				chmod(t, dir, 0o777)
			},
			wantRefused: map[string][]string{
				"l.sock":     {"the plugin directory is not trusted", "writable by others", "chmod go-w "},
				"m/csi.sock": {"the plugin directory is not trusted"},
			},
			wantTop: true,
		},
		{
			name:     "plugin directory writable by others, directory checks off",
			insecure: true,
			setup: func(t *testing.T, dir, _ string) {
				socketFile(t, filepath.Join(dir, "l.sock"))
				chmod(t, dir, 0o777)
			},
			wantSockets: []string{"l"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, outside := testutil.TempDir(t), testutil.TempDir(t)
			tt.setup(t, dir, outside)
			st, err := scanPluginDir(dir, newTrustPolicy(tt.owners, tt.insecure), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for id := range st.Sockets {
				got = append(got, id)
			}
			if !sameSet(got, tt.wantSockets) {
				t.Errorf("sockets = %v, want %v", got, tt.wantSockets)
			}
			if (st.TopProblem != "") != tt.wantTop {
				t.Errorf("TopProblem = %q, want one: %v", st.TopProblem, tt.wantTop)
			}
			if len(st.Refused) != len(tt.wantRefused) {
				t.Errorf("refused = %+v, want %d entries", st.Refused, len(tt.wantRefused))
			}
			ignored := make(map[plugin.Ignored]bool)
			for _, ig := range st.Ignored {
				ignored[ig] = true
			}
			for _, r := range st.Refused {
				rel, _ := filepath.Rel(dir, r.Path)
				want, ok := tt.wantRefused[rel]
				if !ok {
					t.Errorf("refused %s unexpectedly: %s", rel, r.Reason)
					continue
				}
				if id := strings.SplitN(strings.TrimSuffix(rel, SocketSuffix), "/", 2)[0]; r.ID != id {
					t.Errorf("refused %s: plugin id %q, want %q", rel, r.ID, id)
				}
				for _, w := range want {
					if !strings.Contains(r.Reason, w) {
						t.Errorf("refused %s: reason %q does not contain %q", rel, r.Reason, w)
					}
				}
				if !ignored[plugin.Ignored{Path: r.Path, Reason: r.Reason}] {
					t.Errorf("refused %s is not listed as ignored: %+v", rel, st.Ignored)
				}
			}
		})
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	in := make(map[string]bool, len(a))
	for _, s := range a {
		in[s] = true
	}
	for _, s := range b {
		if !in[s] {
			return false
		}
	}
	return true
}

// listenOutside is a unix socket outside the plugin directory; noDial
// checks that nothing ever connected to it.
func listenOutside(t *testing.T, path string) (noDial func()) {
	t.Helper()
	l := listenUnix(t, path)
	return func() {
		t.Helper()
		// A connection made, even one closed again since, waits in the
		// accept queue: a deadline in the past finds it without waiting.
		if err := l.SetDeadline(time.Now()); err != nil {
			t.Fatal(err)
		}
		c, err := l.Accept()
		if err == nil {
			_ = c.Close()
			t.Errorf("%s was dialled through a symlink in the plugin directory", path)
			return
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("accept on %s: %v, want a timeout", path, err)
		}
	}
}

// Symlinks out of the plugin directory are never dialled: neither a
// symlink <id>.sock to a socket outside nor a symlink <id> to a directory
// outside. Each emits one plugin-socket-ignored event naming it, while a
// real plugin next to them is supervised as usual.
func TestSymlinksOutOfThePluginDirAreNeverDialled(t *testing.T) {
	dir, outside := testutil.TempDir(t), testutil.TempDir(t)
	noDialSock := listenOutside(t, filepath.Join(outside, "out.sock"))
	noDialDir := listenOutside(t, filepath.Join(outside, "d", SocketName))
	symlink(t, filepath.Join(outside, "out.sock"), filepath.Join(dir, "evil.sock"))
	symlink(t, filepath.Join(outside, "d"), filepath.Join(dir, "evildir"))
	startPlugin(t, filepath.Join(dir, "good", SocketName), testplugin.Config{})

	m := newTestManager(t, ManagerConfig{PluginDir: dir})
	stop := runManager(t, m)
	awaitReady(t, m)
	reg := m.Registry()
	testutil.WaitFor(t, 10*time.Second, "plugin good healthy", func() bool { return healthOf(reg, "good") == "healthy" })
	for id, path := range map[string]string{"evil": filepath.Join(dir, "evil.sock"), "evildir": filepath.Join(dir, "evildir")} {
		e, ok := findEvent(reg, id, plugin.EventSocketIgnored)
		if !ok {
			t.Errorf("no %s event for %s; events: %v", plugin.EventSocketIgnored, id, eventsOf(reg, id))
			continue
		}
		for _, w := range []string{path + " ignored: ", "outside the plugin directory", "never followed"} {
			if !strings.Contains(e.Description, w) {
				t.Errorf("%s event description %q does not contain %q", id, e.Description, w)
			}
		}
		if _, ok := reg.Get(id); ok {
			t.Errorf("plugin %s registered through a symlink", id)
		}
	}
	// Once the manager has stopped nothing can dial any more: whatever
	// it did is in the accept queues now.
	stop()
	noDialSock()
	noDialDir()
}

// A socket owned by a user who may not serve plugins is never dialled, and
// its event names the socket, the owner and the allowed owners; listed in
// PluginOwners, the same owner is supervised.
func TestSocketOfAnotherUserIsNeverDialled(t *testing.T) {
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "theirs.sock")
	noDial := listenOutside(t, sock)
	chown(t, sock, otherUID)
	startPlugin(t, filepath.Join(dir, "good", SocketName), testplugin.Config{})

	m := newTestManager(t, ManagerConfig{PluginDir: dir})
	stop := runManager(t, m)
	awaitReady(t, m)
	reg := m.Registry()
	testutil.WaitFor(t, 10*time.Second, "plugin good healthy", func() bool { return healthOf(reg, "good") == "healthy" })
	e, ok := findEvent(reg, "theirs", plugin.EventSocketIgnored)
	if !ok {
		t.Fatalf("no %s event for theirs; events: %v", plugin.EventSocketIgnored, eventsOf(reg, "theirs"))
	}
	for _, w := range []string{sock + " ignored: ", "owned by ", "uid 65534", "allowed owners are root (uid 0)", "client.plugin_owners"} {
		if !strings.Contains(e.Description, w) {
			t.Errorf("event description %q does not contain %q", e.Description, w)
		}
	}
	stop()
	noDial()

	// The same socket with its owner among the plugin owners.
	m = startManager(t, ManagerConfig{PluginDir: dir, PluginOwners: []uint32{otherUID}})
	testutil.WaitFor(t, 10*time.Second, "plugin theirs supervised", func() bool {
		_, ok := m.Registry().Get("theirs")
		return ok
	})
}

// awaitScanned makes the watcher scan once more and waits for the state of
// that scan: it creates a marker file (ignored, so it shows in the state)
// and removes it again.
func awaitScanned(t *testing.T, w *watcher, dir string, n int) desiredState {
	t.Helper()
	marker := filepath.Join(dir, "marker-"+strings.Repeat("x", n))
	writeFile(t, marker)
	awaitState(t, w, "marker scanned", func(st desiredState) bool { return hasIgnored(st, marker) })
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	return awaitState(t, w, "marker gone", func(st desiredState) bool { return !hasIgnored(st, marker) })
}

func hasIgnored(st desiredState, path string) bool {
	for _, ig := range st.Ignored {
		if ig.Path == path {
			return true
		}
	}
	return false
}

func refusedReason(st desiredState, path string) string {
	for _, r := range st.Refused {
		if r.Path == path {
			return r.Reason
		}
	}
	return ""
}

// countEvents counts plugin id's events of type typ.
func countEvents(reg *Registry, id string, typ plugin.EventType) int {
	n := 0
	for _, et := range eventsOf(reg, id) {
		if et == typ {
			n++
		}
	}
	return n
}

// plugin-socket-ignored is emitted once per offending path, not at every
// scan; again when the reason changes (a new symlink target); and again
// when the path was fixed and then broke again.
func TestSocketIgnoredEventOncePerPath(t *testing.T) {
	dir, outside := testutil.TempDir(t), testutil.TempDir(t)
	reg := New(Config{})
	w, _ := runWatcher(t, dir, reg)
	link := filepath.Join(dir, "a.sock")
	symlink(t, filepath.Join(outside, "one.sock"), link)
	first := awaitState(t, w, "a.sock refused", func(st desiredState) bool { return refusedReason(st, link) != "" })
	for i := range 3 {
		awaitScanned(t, w, dir, i)
	}
	if n := countEvents(reg, "a", plugin.EventSocketIgnored); n != 1 {
		t.Fatalf("%d %s events after 4 scans, want 1", n, plugin.EventSocketIgnored)
	}

	// A new target is a new reason.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	symlink(t, filepath.Join(outside, "two.sock"), link)
	awaitState(t, w, "a.sock refused for its new target", func(st desiredState) bool {
		r := refusedReason(st, link)
		return r != "" && r != refusedReason(first, link)
	})
	awaitScanned(t, w, dir, 10)
	if n := countEvents(reg, "a", plugin.EventSocketIgnored); n != 2 {
		t.Fatalf("%d %s events after the target changed, want 2", n, plugin.EventSocketIgnored)
	}

	// Fixed, then broken again the same way.
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	awaitState(t, w, "a.sock gone", func(st desiredState) bool { return refusedReason(st, link) == "" })
	symlink(t, filepath.Join(outside, "two.sock"), link)
	awaitState(t, w, "a.sock refused again", func(st desiredState) bool { return refusedReason(st, link) != "" })
	if n := countEvents(reg, "a", plugin.EventSocketIgnored); n != 3 {
		t.Fatalf("%d %s events after a.sock came back, want 3", n, plugin.EventSocketIgnored)
	}
	evs, _ := reg.Events(0)
	for _, e := range evs {
		if e.Type == plugin.EventSocketIgnored && !strings.HasPrefix(e.Description, link+" ignored: ") {
			t.Errorf("event description %q does not start with the path", e.Description)
		}
	}
}

// A new owner of a refused socket is a new reason: one more event.
func TestSocketIgnoredEventAgainOnNewOwner(t *testing.T) {
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "b.sock")
	socketFile(t, sock)
	chown(t, sock, otherUID)
	reg := New(Config{})
	w, _ := runWatcher(t, dir, reg)
	awaitState(t, w, "b.sock refused", func(st desiredState) bool { return strings.Contains(refusedReason(st, sock), "uid 65534") })
	awaitScanned(t, w, dir, 1)
	if n := countEvents(reg, "b", plugin.EventSocketIgnored); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}
	chown(t, sock, otherUID-1)
	awaitState(t, w, "b.sock refused with its new owner", func(st desiredState) bool {
		return strings.Contains(refusedReason(st, sock), "uid 65533")
	})
	if n := countEvents(reg, "b", plugin.EventSocketIgnored); n != 2 {
		t.Fatalf("%d events after the owner changed, want 2", n)
	}
	chown(t, sock, os.Geteuid())
	awaitState(t, w, "b.sock supervised", func(st desiredState) bool { _, ok := st.Sockets["b"]; return ok })
}

// A plugin directory that turns writable by others while running stops
// every socket in it from being dialled, and trusted again, they are back.
func TestWatcherStopsTrustingAnOpenedPluginDir(t *testing.T) {
	dir := testutil.TempDir(t)
	socketFile(t, filepath.Join(dir, "a.sock"))
	reg := New(Config{})
	w, _ := runWatcher(t, dir, reg)
	awaitState(t, w, "socket a", func(st desiredState) bool { _, ok := st.Sockets["a"]; return ok })

	chmod(t, dir, 0o777)
	st := awaitState(t, w, "plugin directory distrusted", func(st desiredState) bool { return st.TopProblem != "" })
	if len(st.Sockets) != 0 {
		t.Errorf("sockets %v of an untrusted plugin directory are to be dialled", st.Sockets)
	}
	if !strings.Contains(refusedReason(st, filepath.Join(dir, "a.sock")), "writable by others") {
		t.Errorf("refused = %+v, want a.sock refused because the directory is writable by others", st.Refused)
	}
	if n := countEvents(reg, "a", plugin.EventSocketIgnored); n != 1 {
		t.Errorf("%d %s events, want 1", n, plugin.EventSocketIgnored)
	}

	chmod(t, dir, 0o700)
	awaitState(t, w, "socket a trusted again", func(st desiredState) bool {
		_, ok := st.Sockets["a"]
		return ok && st.TopProblem == ""
	})
}

// The watcher creates a missing plugin directory with mode 0750 (less
// when the umask takes more away).
func TestWatcherCreatesPluginDir0750(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "plugins")
	runWatcher(t, dir, New(Config{}))
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&^0o750 != 0 || perm&0o700 != 0o700 {
		t.Errorf("plugin directory created with mode %s, want 0750", fi.Mode())
	}
}
