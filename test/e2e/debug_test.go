package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// secret returns a random value named after what it is, so that a leak
// found by the test says which secret leaked.
func secret(t *testing.T, what string) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return what + "-" + hex.EncodeToString(b)
}

// TestMonitorAndOperatorDebug runs `csisupd monitor` and `csisupd operator
// debug` against one agent with both roles, TLS and ACLs on, a Consul
// token in use and an agent token configured: the monitor shows debug
// lines while the agent logs at info, and the debug archive holds every
// file its manifest lists, the plugin, and none of the secrets the test
// used: the ACL tokens, the agent token, the Consul token and a CSI
// secret passed to a volume call.
func TestMonitorAndOperatorDebug(t *testing.T) {
	p := newPKI(t, 1)
	consulToken, agentToken, csiSecret := secret(t, "consul"), secret(t, "agent"), secret(t, "csi")
	consul, err := consultest.New(consultest.Config{
		ACL:          &consultest.ACL{Tokens: map[string]consultest.Policy{consulToken: consultest.AllowAll()}},
		ManualChecks: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)

	pluginDir := testutil.TempDir(t)
	startTestPlugin(t, testplugin.Config{
		Socket: filepath.Join(pluginDir, "tp", "csi.sock"), StateDir: testutil.TempDir(t),
		Type: testplugin.TypeMonolith, NodeID: "csi-node-0", KnownNodeIDs: []string{testplugin.AnyNode},
	})
	ports := testutil.FreePorts(t, 3)
	// The agent registers its node with itself, as a server: its server
	// certificate lets it, so the agent token is configured but never
	// resolved (nothing creates it), and it must not leak all the same.
	cfg := agentHCL(t, "d0", ports[0], ports[1], ports[2], fmt.Sprintf(`log_level = "info"
client { plugin_dir = %q }
server {
  enabled          = true
  bootstrap_expect = 1
}
acl {
  enabled = true
  tokens { agent = %q }
}
%s`, pluginDir, agentToken, p.tlsBlock("server", 0)))
	consulCfg := filepath.Join(testutil.TempDir(t), "consul.hcl")
	if err := os.WriteFile(consulCfg, []byte(fmt.Sprintf("consul {\n  enabled = true\n  address = %q\n  token = %q\n}\n",
		consul.Addr(), consulToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	agent := startAgentProcess(t, "agent d0", ports[2], "--config", cfg, "--config", consulCfg)
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])

	var mgmt tokenDoc
	testutil.WaitFor(t, 60*time.Second, "acl bootstrap", func() bool {
		res := secureCLI(t, p, addr, "", "acl", "bootstrap", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &mgmt) == nil
	})
	rules := filepath.Join(p.dir, "debug.hcl")
	if err := os.WriteFile(rules, []byte(`agent { policy = "write" }
plugin { policy = "read" }
node { policy = "read" }
volume { policy = "read" }
operator { policy = "read" }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "policy", "apply", "debug", rules); res.code != 0 {
		t.Fatalf("policy apply: exit %d: %s", res.code, res.stderr)
	}
	var debugTok tokenDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &debugTok, "acl", "token", "create", "--name", "debug", "--policy", "debug")

	testutil.WaitFor(t, 60*time.Second, "plugin tp healthy in the cluster", func() bool {
		var doc pluginDoc
		res := secureCLI(t, p, addr, mgmt.SecretID, "plugin", "status", "tp", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.ControllersHealthy == 1
	})
	testutil.WaitFor(t, 30*time.Second, "the agent registered in Consul with its token", func() bool {
		_, ok := consul.Service(consulsync.AgentServiceID)
		return ok
	})
	if res := secureCLI(t, p, addr, mgmt.SecretID, "volume", "create", "v1", "--plugin", "tp", "--capacity", "1MiB",
		"--secret", "password="+csiSecret); res.code != 0 {
		t.Fatalf("volume create: exit %d: %s", res.code, res.stderr)
	}
	secrets := map[string]string{
		"management token": mgmt.SecretID, "debug token": debugTok.SecretID,
		"agent token": agentToken, "Consul token": consulToken, "CSI secret": csiSecret,
	}

	// refuse makes one call the agent refuses; the refusal is a debug
	// line of its log. It runs outside the test's goroutine too, so it
	// does not report to t.
	refuse := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append(append([]string{"--address", addr, "--timeout", "10s"}, p.cliFlags()...),
			"--token", "f3c1e2d4-no-such-token", "status")...)
		cmd.Env = cleanEnv()
		_ = cmd.Run() // refused: exit code 1
	}

	t.Run("monitor", func(t *testing.T) {
		var out testutil.SyncBuffer
		mon := exec.Command(binary, append(append([]string{"--address", addr}, p.cliFlags()...),
			"--token", debugTok.SecretID, "monitor", "--log-level", "debug")...)
		mon.Env = cleanEnv()
		mon.Stdout, mon.Stderr = &out, &out
		if err := mon.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- mon.Wait() }()
		defer func() {
			_ = mon.Process.Kill()
			<-exited
		}()
		testutil.WaitFor(t, 30*time.Second, "a refused call in the monitor's stream", func() bool {
			refuse()
			return strings.Contains(out.String(), "[DEBUG] csisupd.auth: call refused")
		})
		if logs := agent.logs.String(); strings.Contains(logs, "[DEBUG]") {
			t.Errorf("the agent at info logged debug lines:\n%s", logs)
		}
		if err := mon.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			exited <- err // for the deferred Wait
			if err != nil {
				t.Errorf("monitor after an interrupt: %v\n%s", err, out.String())
			}
		case <-time.After(10 * time.Second):
			t.Errorf("monitor still runs 10s after an interrupt")
		}
		assertNoSecrets(t, "the monitor's output", out.String(), secrets)
	})

	t.Run("operator debug", func(t *testing.T) {
		outDir := testutil.TempDir(t)
		// Refused calls while the bundle is collected put debug lines in
		// its log stream.
		ctx, cancel := context.WithCancel(context.Background())
		refusing := make(chan struct{})
		go func() {
			defer close(refusing)
			for ctx.Err() == nil {
				refuse()
			}
		}()
		res := secureCLI(t, p, addr, debugTok.SecretID, "operator", "debug", "--duration", "3s", "--interval", "1s", "--output", outDir)
		cancel()
		<-refusing
		if res.code != 0 {
			t.Fatalf("operator debug: exit %d: %s%s", res.code, res.stdout, res.stderr)
		}
		archive := strings.TrimSpace(res.stdout)
		if filepath.Dir(archive) != outDir || !strings.HasSuffix(archive, ".tar.gz") {
			t.Fatalf("operator debug printed %q, want an archive in %s", res.stdout, outDir)
		}
		if info, err := os.Stat(archive); err != nil || info.Mode().Perm() != 0o600 {
			t.Fatalf("archive %s: %v, %v; want mode 0600", archive, info, err)
		}
		bundle := extract(t, archive, testutil.TempDir(t))

		var manifest struct {
			Version  string   `json:"version"`
			Duration string   `json:"duration"`
			Files    []string `json:"files"`
			Errors   []struct {
				Part  string `json:"part"`
				Error string `json:"error"`
			} `json:"errors"`
		}
		data, err := os.ReadFile(filepath.Join(bundle, "manifest.json"))
		if err != nil || json.Unmarshal(data, &manifest) != nil {
			t.Fatalf("manifest.json: %v\n%s", err, data)
		}
		if len(manifest.Errors) != 0 || manifest.Duration != "3s" {
			t.Errorf("manifest: duration %q, errors %+v; want 3s and none", manifest.Duration, manifest.Errors)
		}
		read := func(name string) string {
			t.Helper()
			b, err := os.ReadFile(filepath.Join(bundle, name))
			if err != nil {
				t.Errorf("a file of the manifest: %v", err)
			}
			return string(b)
		}
		for _, name := range manifest.Files {
			read(name)
		}
		for _, name := range []string{"agent/status.json", "agent/events.json", "agent/config.hcl", "agent/monitor.log",
			"agent/metrics/0000.prom", "agent/pprof/cpu.prof", "agent/pprof/heap.prof", "agent/pprof/goroutine.txt",
			"cluster/plugins.json", "cluster/nodes.json", "cluster/volumes.json", "cluster/raft-peers.json"} {
			if !slices.Contains(manifest.Files, name) {
				t.Errorf("the manifest does not list %s: %v", name, manifest.Files)
			}
		}
		for name, want := range map[string]string{
			"agent/status.json":         `"id": "tp"`,
			"agent/events.json":         `"type":"plugin-registered","plugin_id":"tp"`,
			"agent/config.hcl":          "  token = \"[redacted]\"\n",
			"agent/monitor.log":         "[DEBUG] csisupd.auth: call refused",
			"agent/metrics/0000.prom":   "go_goroutines",
			"agent/pprof/goroutine.txt": "goroutine ",
			"cluster/plugins.json":      `"id": "tp"`,
			"cluster/volumes.json":      `"id": "v1"`,
			"cluster/raft-peers.json":   `"leader": true`,
		} {
			if got := read(name); !strings.Contains(got, want) {
				t.Errorf("%s lacks %q:\n%.1000s", name, want, got)
			}
		}
		if !strings.Contains(read("agent/config.hcl"), "    agent = \"[redacted]\"\n") {
			t.Errorf("agent/config.hcl does not show the agent token redacted:\n%s", read("agent/config.hcl"))
		}
		if cpu := read("agent/pprof/cpu.prof"); len(cpu) < 2 || cpu[:2] != "\x1f\x8b" {
			t.Errorf("agent/pprof/cpu.prof is not a gzipped profile: %d bytes", len(cpu))
		}
		// Every file of the bundle, whatever its kind, against every
		// secret.
		err = filepath.WalkDir(bundle, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(bundle, path)
			assertNoSecrets(t, rel, string(b), secrets)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	assertNoSecrets(t, "the agent's log", agent.logs.String(), secrets)
}

// assertNoSecrets fails the test for every secret that text shows.
func assertNoSecrets(t *testing.T, where, text string, secrets map[string]string) {
	t.Helper()
	for what, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s shows the %s", where, what)
		}
	}
}

// extract unpacks the debug archive at path into dir, checking that it
// holds one directory named as the archive with files of mode 0600 only,
// and returns that directory.
func extract(t *testing.T, path, dir string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	top := strings.TrimSuffix(filepath.Base(path), ".tar.gz")
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return filepath.Join(dir, top)
		}
		if err != nil {
			t.Fatal(err)
		}
		clean := filepath.Clean(hdr.Name)
		if hdr.Typeflag != tar.TypeReg || !strings.HasPrefix(clean, top+string(filepath.Separator)) || hdr.Mode != 0o600 {
			t.Fatalf("archive entry %s: type %c, mode %o; want files of mode 0600 under %s", hdr.Name, hdr.Typeflag, hdr.Mode, top)
		}
		target := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
