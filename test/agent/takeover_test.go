package agent_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// stages counts the NodeStageVolume calls a csi-testplugin's journal
// recorded.
func stages(t *testing.T, journal string) int {
	t.Helper()
	f, err := os.Open(journal)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var rec testplugin.JournalRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("journal %s: %v", journal, err)
		}
		if rec.Method == "NodeStageVolume" && rec.Phase == testplugin.JournalBegin {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// A driver's registrar naming the id of a healthy plugin with a claim
// mounted on the node, at another socket, is refused and exits 1 with the
// reason; the plugin keeps its socket, a plugin-conflict event names both,
// and the next claim's NodeStageVolume reaches the original plugin. Once
// the original's socket is gone the id stays held while its mounts are
// there, and once it has been gone for deregister_grace the registrar,
// restarted as its container would be, is accepted.
func TestRegistrarCannotTakeOverPluginInUse(t *testing.T) {
	dir := testutil.TempDir(t)
	pluginDir := filepath.Join(dir, "plugins")
	regDir := filepath.Join(dir, "plugins_registry")
	holder := filepath.Join(pluginDir, "tp", "csi.sock")
	endpoint := filepath.Join(dir, "kubelet", "plugins", "tp", "csi.sock")
	for _, d := range []string{regDir, filepath.Dir(holder), filepath.Dir(endpoint)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	holderJournal, newcomerJournal := filepath.Join(dir, "holder.jsonl"), filepath.Join(dir, "newcomer.jsonl")
	original := startTestPlugin(t, holder, "--journal", holderJournal)
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
client {
  plugin_dir               = %q
  kubelet_registration_dir = %q
  deregister_grace         = "5s"
}
`, pluginDir, regDir))
	const node = "n1"
	a := startAgent(t, nil, "--dev", "--name", node, "--data-dir", filepath.Join(dir, "data"), "--config", cfgFile)
	events := a.watchEvents(t)
	a.waitHealthy(t, "tp")
	cli := func(args ...string) string {
		t.Helper()
		r := runCLI(t, append([]string{"--address", a.addr()}, args...)...)
		if r.code != 0 {
			t.Fatalf("csisupd %v: exit %d: %s", args, r.code, r.Stderr)
		}
		return r.Stdout
	}
	cli("volume", "create", "v1", "--plugin", "tp")
	cli("volume", "claim", "v1", "--node", node, "--workload", "w1")
	if n := stages(t, holderJournal); n != 1 {
		t.Fatalf("the original plugin staged %d times for the claim, want 1", n)
	}

	startTestPlugin(t, endpoint, "--journal", newcomerJournal)
	registrar := func() *process {
		return testutil.StartProcess(t, nil, testRegistrarBin, "--registration-dir", regDir, "--driver-name", "tp", "--endpoint", endpoint)
	}
	reg := registrar()
	testutil.WaitFor(t, 20*time.Second, "the refused registrar exits", reg.Exited)
	// The registrar logs the reason quoted.
	if code, why := reg.ExitCode(), strings.ReplaceAll(reg.Stderr.String(), `\"`, `"`); code != 1 || !strings.Contains(why, `"tp"`) || !strings.Contains(why, holder) {
		t.Fatalf("registrar exit code %d, stderr:\n%s\nwant 1 and the reason naming the id and %s", code, why, holder)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin-conflict", func() bool {
		for _, e := range events.eventsOfType("tp", "plugin-conflict") {
			if strings.Contains(e.Description, holder) && strings.Contains(e.Description, endpoint) {
				return true
			}
		}
		return false
	})
	if p := a.status(t).plugin("tp"); p["socket"] != holder {
		t.Fatalf("after the refused registration tp is at %v, want %s", p["socket"], holder)
	}
	cli("volume", "create", "v2", "--plugin", "tp")
	cli("volume", "claim", "v2", "--node", node, "--workload", "w2")
	if got, stray := stages(t, holderJournal), stages(t, newcomerJournal); got != 2 || stray != 0 {
		t.Fatalf("NodeStageVolume calls: %d by the original plugin, %d by the newcomer; want 2 and 0", got, stray)
	}

	// The original plugin goes away: unhealthy, it still has mounts, so
	// its id stays held until it is deregistered.
	original.Signal(t, syscall.SIGTERM)
	testutil.WaitFor(t, 10*time.Second, "the original plugin stopped", original.Exited)
	testutil.WaitFor(t, 10*time.Second, "plugin-unhealthy", func() bool {
		return len(events.eventsOfType("tp", "plugin-unhealthy")) == 1
	})
	reg = registrar()
	testutil.WaitFor(t, 20*time.Second, "the registrar refused again", reg.Exited)
	if len(events.eventsOfType("tp", "plugin-deregistered")) != 0 {
		t.Fatal("tp was deregistered before the second registrar was answered: deregister_grace too short for this machine")
	}
	if code := reg.ExitCode(); code != 1 {
		t.Fatalf("while the unhealthy plugin has mounts, a registrar exits %d, want 1 (refused): %s", code, reg.Stderr)
	}
	testutil.WaitFor(t, 20*time.Second, "plugin-deregistered", func() bool {
		return len(events.eventsOfType("tp", "plugin-deregistered")) == 1
	})
	reg = registrar()
	testutil.WaitFor(t, 20*time.Second, "the restarted registrar told it is registered", func() bool {
		if reg.Exited() {
			t.Fatalf("registrar exited %d: %s", reg.ExitCode(), reg.Stderr)
		}
		return strings.Contains(reg.Stdout.String(), "registered")
	})
	if p := a.waitHealthy(t, "tp"); p["socket"] != endpoint {
		t.Errorf("tp is at %v once registered, want %s", p["socket"], endpoint)
	}
}
