package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// runMainEnv makes the test binary act as the command, so tests can run it
// as a real process without building it.
const runMainEnv = "CSI_TESTPLUGIN_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
	}
	goleak.VerifyTestMain(m)
}

// start runs the command in a child process and waits for its ready line.
func start(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
	}()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "csi-testplugin: serving") {
			t.Fatalf("first line %q, want the ready line; stderr: %s", line, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no ready line; stderr: %s", stderr.String())
	}
	return cmd
}

// exitCode waits for cmd and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode()
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func pluginInfo(t *testing.T, socket string) (*csi.GetPluginInfoResponse, *csi.NodeGetInfoResponse) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		t.Fatalf("GetPluginInfo on %s: %v", socket, err)
	}
	node, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatalf("NodeGetInfo on %s: %v", socket, err)
	}
	return info, node
}

func TestManyPluginsStopOnSIGTERM(t *testing.T) {
	dir := shortDir(t)
	cmd := start(t, "--dir", dir, "--count", "3", "--type", "node", "--node-id", "n1", "--state-dir", t.TempDir())
	for i := range 3 {
		sock := filepath.Join(dir, fmt.Sprintf("p%04d", i), "csi.sock")
		info, node := pluginInfo(t, sock)
		if want := fmt.Sprintf("p%04d.csi.testplugin.csisupd", i); info.GetName() != want {
			t.Errorf("plugin %d name %q, want %q", i, info.GetName(), want)
		}
		if node.GetNodeId() != "n1" {
			t.Errorf("plugin %d node id %q, want n1", i, node.GetNodeId())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd); code != exitOK {
		t.Fatalf("exit status %d after SIGTERM, want %d", code, exitOK)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "csi.sock"))
	if len(matches) != 0 {
		t.Fatalf("sockets left after SIGTERM: %v", matches)
	}
}

// refused checks that socket exists but nobody listens.
func refused(t *testing.T, socket string) {
	t.Helper()
	if fi, err := os.Lstat(socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket %s: %v, want it left behind", socket, err)
	}
	conn, err := net.Dial("unix", socket)
	if err == nil {
		conn.Close()
		t.Fatal("dial succeeded, want connection refused")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial: %v, want ECONNREFUSED", err)
	}
}

func TestSIGKILLLeavesSocket(t *testing.T) {
	sock := filepath.Join(shortDir(t), "csi.sock")
	cmd := start(t, "--socket", sock, "--node-id", "n1")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	exitCode(t, cmd)
	refused(t, sock)
}

func TestExitAfterCrashes(t *testing.T) {
	sock := filepath.Join(shortDir(t), "csi.sock")
	cmd := start(t, "--socket", sock, "--node-id", "n1", "--exit-after", "100ms")
	if code := exitCode(t, cmd); code != exitCrash {
		t.Fatalf("exit status %d, want %d", code, exitCrash)
	}
	refused(t, sock)
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no socket or dir", nil, "exactly one of --socket and --dir"},
		{"both", []string{"--socket", "a", "--dir", "b"}, "exactly one of --socket and --dir"},
		{"count without dir", []string{"--socket", "a", "--count", "2"}, "--count needs --dir"},
		{"zero count", []string{"--dir", "b", "--count", "0"}, "--count 0"},
		{"bad topology", []string{"--socket", "a", "--topology", "zone"}, "not key=value"},
		{"unknown flag", []string{"--nope"}, "nope"},
		{"bad log level", []string{"--socket", "a", "--log-level", "loud"}, "--log-level"},
		{"bad mounts", []string{"--socket", "a", "--mounts", "overlay"}, "--mounts \"overlay\""},
		{"bad expansion", []string{"--socket", "a", "--expansion", "sometimes"}, "--expansion \"sometimes\""},
		{"negative ready after", []string{"--socket", "a", "--snapshot-ready-after", "-1"}, "--snapshot-ready-after"},
		{"zero content bytes", []string{"--socket", "a", "--max-content-bytes", "0"}, "--max-content-bytes"},
		{"unknown capability", []string{"--socket", "a", "--controller-capabilities", "CLONE_VOLUME,TELEPORT"}, "\"TELEPORT\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != exitUsage {
				t.Fatalf("exit status %d, want %d; stderr: %s", code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr %q does not mention %q", stderr.String(), tt.want)
			}
		})
	}
}

// Every Config field the flags set reaches the plugin's Config.
func TestPluginConfigFlags(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(testplugin.Config) bool
	}{
		{"defaults", nil, func(c testplugin.Config) bool {
			return !c.NodeLocal && c.TopologyKey == "" && c.Expansion == testplugin.ExpansionOnline && !c.NodeExpansionRequired &&
				c.MutableParameters == nil && c.SnapshotReadyAfter == 0 && c.MaxContentBytes == testplugin.DefaultMaxContentBytes &&
				!c.VolumeHealth && !c.VolumeMountGroup && c.ControllerCapabilities == nil && c.Journal == ""
		}},
		{"journal", []string{"--journal", "calls.jsonl"}, func(c testplugin.Config) bool {
			return c.Journal == "calls.jsonl"
		}},
		{"node-local", []string{"--node-local", "--topology-key", "example.com/host"}, func(c testplugin.Config) bool {
			return c.NodeLocal && c.TopologyKey == "example.com/host"
		}},
		{"expansion", []string{"--expansion", "offline", "--node-expansion-required"}, func(c testplugin.Config) bool {
			return c.Expansion == testplugin.ExpansionOffline && c.NodeExpansionRequired
		}},
		{"mutable parameters", []string{"--mutable-parameters", "qos,iops"}, func(c testplugin.Config) bool {
			return slices.Equal(c.MutableParameters, []string{"qos", "iops"})
		}},
		{"no mutable parameters", []string{"--mutable-parameters", ""}, func(c testplugin.Config) bool {
			return c.MutableParameters != nil && len(c.MutableParameters) == 0
		}},
		{"snapshots and content", []string{"--snapshot-ready-after", "3", "--max-content-bytes", "4096"}, func(c testplugin.Config) bool {
			return c.SnapshotReadyAfter == 3 && c.MaxContentBytes == 4096
		}},
		{"node capabilities", []string{"--volume-health", "--volume-mount-group"}, func(c testplugin.Config) bool {
			return c.VolumeHealth && c.VolumeMountGroup
		}},
		{"volume conditions file", []string{"--volume-conditions", "/run/conditions"}, func(c testplugin.Config) bool {
			return c.VolumeConditionsFile == "/run/conditions"
		}},
		{"controller capabilities", []string{"--controller-capabilities", "default,clone_volume, MODIFY_VOLUME"}, func(c testplugin.Config) bool {
			return slices.Equal(c.ControllerCapabilities, append(slices.Clone(testplugin.DefaultControllerCapabilities),
				csi.ControllerServiceCapability_RPC_CLONE_VOLUME, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME))
		}},
		{"all controller capabilities", []string{"--controller-capabilities", "all"}, func(c testplugin.Config) bool {
			return slices.Equal(c.ControllerCapabilities, testplugin.SupportedControllerCapabilities)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parse(append([]string{"--socket", "a"}, tt.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := pluginConfig(o)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("config from %q: %+v", tt.args, cfg)
			}
		})
	}
}

// A node-local plugin process reports its node as its topology.
func TestNodeLocalFlag(t *testing.T) {
	sock := filepath.Join(shortDir(t), "csi.sock")
	start(t, "--socket", sock, "--node-id", "n7", "--node-local", "--topology-key", "example.com/host", "--state-dir", t.TempDir())
	_, node := pluginInfo(t, sock)
	if got := node.GetAccessibleTopology().GetSegments(); len(got) != 1 || got["example.com/host"] != "n7" {
		t.Fatalf("NodeGetInfo topology = %v, want example.com/host=n7", got)
	}
}

func TestBadConfigIsAnError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--socket", filepath.Join(shortDir(t), "csi.sock"), "--type", "weird", "--state-dir", t.TempDir()}
	if code := run(args, &stdout, &stderr); code != exitError {
		t.Fatalf("exit status %d, want %d; stderr: %s", code, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), "Config.Type") {
		t.Fatalf("stderr %q does not name the bad field", stderr.String())
	}
}

// probe calls Probe on socket n times over one connection.
func probe(t *testing.T, socket string, n int) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range n {
		if _, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}); err != nil {
			t.Fatalf("Probe on %s: %v", socket, err)
		}
	}
}

// readProbeLog returns the lines of a probe log, split into id and time;
// a malformed line fails the test.
func readProbeLog(t *testing.T, path string) (ids []string, times []time.Time) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		id, ns, ok := strings.Cut(line, " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil || id == "" {
			t.Fatalf("probe log line %q is not \"<id> <unix ns>\"", line)
		}
		ids = append(ids, id)
		times = append(times, time.Unix(0, n))
	}
	return ids, times
}

// --probe-log records every Probe, and only Probe, with the plugin id and
// the time, and writes it while the plugins run, not only at exit.
func TestProbeLog(t *testing.T) {
	dir := shortDir(t)
	logFile := filepath.Join(t.TempDir(), "probes.log")
	cmd := start(t, "--dir", dir, "--count", "2", "--state-dir", t.TempDir(), "--probe-log", logFile)
	before := time.Now()
	probe(t, filepath.Join(dir, "p0000", "csi.sock"), 3)
	probe(t, filepath.Join(dir, "p0001", "csi.sock"), 1)
	pluginInfo(t, filepath.Join(dir, "p0000", "csi.sock")) // not a probe: not logged
	after := time.Now()

	// The command keeps running: the lines must come from the periodic
	// flush. 5 s is far above the 100 ms flush interval, for slow CI.
	deadline := time.Now().Add(5 * time.Second)
	var ids []string
	var times []time.Time
	for {
		ids, times = readProbeLog(t, logFile)
		if len(ids) >= 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	check := func(when string) {
		t.Helper()
		count := map[string]int{}
		for i, id := range ids {
			count[id]++
			if times[i].Before(before) || times[i].After(after) {
				t.Errorf("%s: probe of %s logged at %v, outside the calls (%v to %v)", when, id, times[i], before, after)
			}
		}
		if len(ids) != 4 || count["p0000"] != 3 || count["p0001"] != 1 {
			t.Errorf("%s: probe log holds %v, want p0000 three times and p0001 once", when, ids)
		}
	}
	check("while running")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, cmd); code != exitOK {
		t.Fatalf("exit status %d after SIGTERM, want %d", code, exitOK)
	}
	ids, times = readProbeLog(t, logFile)
	check("after exit")
}

// Concurrent plugins share one log: no line is lost or torn, Close writes
// what is buffered, and records after Close are dropped, not written to a
// closed file.
func TestProbeLogConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "probes.log")
	// An hour-long flush interval: only Close can write the buffer's tail.
	l, err := openProbeLog(path, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	logger := hclog.NewNullLogger()
	var wg sync.WaitGroup
	for g := range 8 {
		lg := l.logger(logger, fmt.Sprintf("p%04d", g)).Named("testplugin").With("socket", "x")
		wg.Go(func() {
			for range 100 {
				lg.Debug("call", "method", "Probe", "code", "OK")
				lg.Debug("call", "method", "GetPluginInfo", "code", "OK")
				lg.Debug("serving", "type", "node")
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.record("late", time.Now())
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ids, _ := readProbeLog(t, path)
	count := map[string]int{}
	for _, id := range ids {
		count[id]++
	}
	for g := range 8 {
		if id := fmt.Sprintf("p%04d", g); count[id] != 100 {
			t.Errorf("%s logged %d times, want 100", id, count[id])
		}
	}
	if len(ids) != 800 {
		t.Errorf("probe log has %d lines, want 800", len(ids))
	}
}

func TestSocketPluginID(t *testing.T) {
	for socket, want := range map[string]string{
		"/run/csi/plugins/ebs/csi.sock": "ebs",
		"/run/csi/plugins/nfs.sock":     "nfs",
		"relative/p0001/csi.sock":       "p0001",
	} {
		if got := socketPluginID(socket); got != want {
			t.Errorf("socketPluginID(%q) = %q, want %q", socket, got, want)
		}
	}
}

func TestProbeLogUnwritable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--socket", filepath.Join(shortDir(t), "csi.sock"), "--state-dir", t.TempDir(),
		"--probe-log", filepath.Join(t.TempDir(), "missing", "probes.log")}
	if code := run(args, &stdout, &stderr); code != exitError {
		t.Fatalf("exit status %d, want %d; stderr: %s", code, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), "probe log") {
		t.Fatalf("stderr %q does not name the probe log", stderr.String())
	}
}

func TestRequireSecretsFlag(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("# the storage's token\ntoken = s3cr3t-value\n\nuser=admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := parse([]string{"--socket", "a", "--require-secrets", good}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pluginConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.RequiredSecrets) != 2 || cfg.RequiredSecrets["token"] != "s3cr3t-value" || cfg.RequiredSecrets["user"] != "admin" {
		t.Fatalf("required secrets: %d keys", len(cfg.RequiredSecrets))
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("token = x\ns3cr3t-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parse([]string{"--socket", "a", "--require-secrets", bad}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pluginConfig(o); err == nil || !strings.Contains(err.Error(), bad+":2") || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("a bad line: %v, want the file and line, never the value", err)
	}
}
