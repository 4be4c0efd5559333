package dockerplugin_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/dockerplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// socketGroup returns a group other than root's for the socket tests:
// daemon's, else the first group of /etc/group with a gid above 0.
func socketGroup(t *testing.T) (name string, gid int) {
	t.Helper()
	if g, err := user.LookupGroup("daemon"); err == nil {
		n, _ := strconv.Atoi(g.Gid)
		return g.Name, n
	}
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Skipf("no group to give the socket: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 {
			if n, err := strconv.Atoi(f[2]); err == nil && n > 0 {
				return f[0], n
			}
		}
	}
	t.Skip("no group other than root's in /etc/group")
	return "", 0
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving the socket a group and running a helper as another user need root")
	}
}

// TestSocketModeAndOwner checks the socket's mode (0660), owner (root)
// and group, by name and by number, and the directory made for it.
func TestSocketModeAndOwner(t *testing.T) {
	requireRoot(t)
	name, gid := socketGroup(t)
	for _, group := range []string{name, strconv.Itoa(gid)} {
		t.Run(group, func(t *testing.T) {
			cfg := testConfig(t, newFakeCluster(nodeID))
			cfg.Group = group
			c := startServer(t, cfg)
			fi, err := os.Lstat(cfg.Socket)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
				t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
			}
			if st.Uid != 0 || int(st.Gid) != gid {
				t.Errorf("socket owner %d:%d, want 0:%d", st.Uid, st.Gid, gid)
			}
			di, err := os.Stat(filepath.Dir(cfg.Socket))
			if err != nil || di.Mode().Perm() != 0o755 {
				t.Errorf("socket directory: %v, %v; want it made 0755", di.Mode(), err)
			}
			// No temporary name is left beside it.
			entries, _ := os.ReadDir(filepath.Dir(cfg.Socket))
			if len(entries) != 1 {
				t.Errorf("socket directory holds %d entries, want the socket only", len(entries))
			}
			c.ok("/Plugin.Activate", nil, nil)
		})
	}
}

// TestSocketRefusesOthers runs a helper as nobody, outside root and the
// socket's group, which must get EACCES; the same helper with the group
// connects, so the refusal is the socket's mode and not the path.
func TestSocketRefusesOthers(t *testing.T) {
	requireRoot(t)
	_, gid := socketGroup(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody to run the helper as: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	ngid, _ := strconv.Atoi(nobody.Gid)
	if ngid == gid {
		t.Skipf("nobody's group is the socket's group %d", gid)
	}

	dir := testutil.TempDir(t)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	helper := copyExecutable(t, dir)
	cfg := testConfig(t, newFakeCluster(nodeID))
	cfg.Socket = filepath.Join(dir, "run", "csisupd.sock")
	cfg.Group = strconv.Itoa(gid)
	startServer(t, cfg)

	run := func(groups []uint32) int {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, helper, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialHelperEnv+"="+cfg.Socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(ngid), Groups: groups}}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &exit):
			t.Logf("helper as uid %d, groups %v: exit %d: %s", uid, groups, exit.ExitCode(), out)
			return exit.ExitCode()
		default:
			t.Fatalf("run the helper as uid %d: %v", uid, err)
			return -1
		}
	}
	if code := run(nil); code != 3 {
		t.Errorf("helper outside root and the group: exit %d, want 3 (EACCES)", code)
	}
	if code := run([]uint32{uint32(gid)}); code != 0 {
		t.Errorf("helper in the socket's group: exit %d, want 0 (connected)", code)
	}
}

// copyExecutable copies the test binary into dir, mode 0755, so that
// another user may run it (the build directory is root's alone).
func copyExecutable(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = src.Close() }()
	path := filepath.Join(dir, "helper")
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestStaleSocket checks that New removes a socket file no one serves,
// refuses one another process serves, and leaves any other file alone.
func TestStaleSocket(t *testing.T) {
	t.Run("stale", func(t *testing.T) {
		cfg := testConfig(t, newFakeCluster(nodeID))
		if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		_ = l.Close()
		c := startServer(t, cfg)
		c.ok("/Plugin.Activate", nil, nil)
	})
	t.Run("served", func(t *testing.T) {
		cfg := testConfig(t, newFakeCluster(nodeID))
		if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		_, err = dockerplugin.New(cfg, hclog.NewNullLogger())
		if err == nil || !strings.Contains(err.Error(), "served by another process") {
			t.Fatalf("New over a served socket: %v, want an error saying it is served", err)
		}
		if conn, err := net.Dial("unix", cfg.Socket); err != nil {
			t.Fatalf("the other process's socket is gone: %v", err)
		} else {
			_ = conn.Close()
		}
	})
	t.Run("not a socket", func(t *testing.T) {
		cfg := testConfig(t, newFakeCluster(nodeID))
		if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(cfg.Socket, []byte("data"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := dockerplugin.New(cfg, hclog.NewNullLogger())
		if err == nil || !strings.Contains(err.Error(), "not a socket") || !strings.Contains(err.Error(), "docker.socket") {
			t.Fatalf("New over a file: %v, want an error naming docker.socket and saying it is not a socket", err)
		}
		if data, err := os.ReadFile(cfg.Socket); err != nil || string(data) != "data" {
			t.Fatalf("the file was changed: %q, %v", data, err)
		}
	})
}

// TestNewRefuses checks New's errors: each names what is wrong, and a
// refused New leaves no socket.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*dockerplugin.Config)
		want string
	}{
		{"no socket", func(c *dockerplugin.Config) { c.Socket = "" }, "docker.socket is required"},
		{"relative socket", func(c *dockerplugin.Config) { c.Socket = "run/csisupd.sock" }, "docker.socket \"run/csisupd.sock\" must be an absolute path"},
		{"short lease", func(c *dockerplugin.Config) { c.Lease = time.Second }, "lease"},
		{"long lease", func(c *dockerplugin.Config) { c.Lease = 25 * time.Hour }, "lease"},
		{"bad default plugin", func(c *dockerplugin.Config) { c.DefaultPlugin = "a b" }, "docker.default_plugin"},
		{"engine without interval", func(c *dockerplugin.Config) { c.EngineSocket = "/run/docker.sock" }, "docker.reconcile_interval"},
		{"relative engine", func(c *dockerplugin.Config) { c.EngineSocket, c.ReconcileInterval = "docker.sock", time.Minute }, "docker.engine_socket"},
		{"no cluster", func(c *dockerplugin.Config) { c.Cluster = nil }, "Cluster is required"},
		{"unknown group", func(c *dockerplugin.Config) { c.Group = "no-such-group-csisupd" }, "docker.group \"no-such-group-csisupd\""},
		{"negative gid", func(c *dockerplugin.Config) { c.Group = "-5" }, "docker.group"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, newFakeCluster(nodeID))
			socket := cfg.Socket
			tc.edit(&cfg)
			_, err := dockerplugin.New(cfg, hclog.NewNullLogger())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
			if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused New left %s: %v", socket, err)
			}
		})
	}
}

// TestCloseWithoutRun checks that Close releases the socket of a Server
// that never ran, and that Run then refuses to start.
func TestCloseWithoutRun(t *testing.T) {
	cfg := testConfig(t, newFakeCluster(nodeID))
	s, err := dockerplugin.New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != cfg.Socket {
		t.Fatalf("Addr %q, want %q", s.Addr(), cfg.Socket)
	}
	if _, err := os.Lstat(cfg.Socket); err != nil {
		t.Fatalf("New made no socket: %v", err)
	}
	s.Close()
	s.Close()
	if _, err := os.Lstat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Close: %v, want it removed", err)
	}
	if err := s.Run(context.Background()); err == nil {
		t.Fatal("Run after Close returned nil, want an error")
	}
}

// TestRunLeavesASuccessorsSocket checks that a Server whose socket file
// was replaced (a new agent took the path) does not remove the new one.
func TestRunLeavesASuccessorsSocket(t *testing.T) {
	cfg := testConfig(t, newFakeCluster(nodeID))
	s, err := dockerplugin.New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(cfg.Socket); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	s.Close()
	if _, err := os.Lstat(cfg.Socket); err != nil {
		t.Fatalf("Close removed the successor's socket: %v", err)
	}
}

// TestShutdownFinishesCallsInFlight checks that Run, once its context
// ends, stops taking connections but lets a call in flight finish and
// answer before it returns and removes the socket.
func TestShutdownFinishesCallsInFlight(t *testing.T) {
	fc := newFakeCluster(nodeID)
	fc.addVolume(&csisupdv1.Volume{Id: "v1", PluginId: "testplugin"})
	g := fc.hold("Claim")
	cfg := testConfig(t, fc)
	s, err := dockerplugin.New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	c := newPluginClient(t, s.Addr())
	type result struct {
		status int
		err    error
	}
	got := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://plugin/VolumeDriver.Mount", strings.NewReader(`{"Name":"v1","ID":"`+idA+`"}`))
		resp, err := c.client.Do(req)
		if err != nil {
			got <- result{err: err}
			return
		}
		_ = resp.Body.Close()
		got <- result{status: resp.StatusCode}
	}()
	select {
	case <-g.entered:
	case <-time.After(waitTimeout):
		t.Fatal("Mount did not reach Claim")
	}
	cancel()
	testutil.WaitFor(t, waitTimeout, "the socket to stop taking connections", func() bool {
		conn, err := net.Dial("unix", cfg.Socket)
		if err == nil {
			_ = conn.Close()
		}
		return err != nil
	})
	close(g.release)
	select {
	case r := <-got:
		if r.err != nil || r.status != http.StatusOK {
			t.Fatalf("the call in flight at shutdown: status %d, error %v; want it answered 200", r.status, r.err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the call in flight got no answer")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return")
	}
	if _, err := os.Lstat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Run: %v, want it removed", err)
	}
	if got := fc.workloads("v1"); len(got) != 1 {
		t.Fatalf("claims: %v, want the claim the call made", got)
	}
}
