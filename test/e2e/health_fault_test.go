//go:build fault

package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestVolumeHealthOfRealAgents reports a claimed volume abnormal in its
// controller and in its node plugin, behind real agent processes that
// list and ask health every second: the server records both conditions
// (volume status, volume status --health, a volume-abnormal event each,
// csisupd_cluster_volumes_abnormal); while nothing changes, further
// rounds of both write nothing; back to normal gives a volume-normal
// event each and no conditions.
func TestVolumeHealthOfRealAgents(t *testing.T) {
	n := startClaimNodeWith(t, claimNodeOptions{grace: "1h", health: true})
	vol, claim, _ := n.createAndClaim(t)
	events := followCLI(t, n.serverAddr, "events", "--cluster", "--volume", "v1", "--json")

	n.controller.SetVolumeCondition(vol.ExternalID, true, "pool degraded")
	n.node.SetVolumeCondition(vol.ExternalID, true, "path flapping")
	var conditions []conditionDoc
	testutil.WaitFor(t, 60*time.Second, "both conditions recorded", func() bool {
		conditions = volumeConditions(t, n.serverAddr, "v1")
		return len(conditions) == 2
	})
	for _, c := range conditions {
		want := map[string]string{"controller": "pool degraded", claim.NodeID: "path flapping"}[c.Source]
		if want == "" || !strings.Contains(c.Message, want) {
			t.Errorf("condition %+v, want the controller's and node %s's", c, claim.NodeID)
		}
	}
	if out := cli(t, n.serverAddr, "volume", "status", "v1", "--health").stdout; strings.Count(out, "abnormal") < 2 ||
		!strings.Contains(out, "pool degraded") || !strings.Contains(out, "path flapping") {
		t.Errorf("volume status --health:\n%s", out)
	}
	testutil.WaitFor(t, 30*time.Second, "a volume-abnormal event of each source", func() bool {
		return len(eventsOfType(t, events.String(), "volume-abnormal")) == 2
	})
	if m := httpGet(t, n.serverHTTP, "/metrics"); !regexp.MustCompile(`(?m)^csisupd_cluster_volumes_abnormal 1$`).MatchString(m) {
		t.Errorf("metrics: no csisupd_cluster_volumes_abnormal 1 with one abnormal volume")
	}

	// Steady state: three more rounds of both sources write nothing.
	eventsBefore, indexBefore := events.String(), raftIndex(t, n.serverAddr)
	listed, asked := n.controller.Stats().Calls["ControllerListVolumeHealth"], n.node.Stats().Calls["NodeGetVolumeHealth"]
	testutil.WaitFor(t, 60*time.Second, "three more health rounds of the controller and the node", func() bool {
		return n.controller.Stats().Calls["ControllerListVolumeHealth"] >= listed+3 && n.node.Stats().Calls["NodeGetVolumeHealth"] >= asked+3
	})
	if again := volumeConditions(t, n.serverAddr, "v1"); len(again) != 2 || again[0] != conditions[0] || again[1] != conditions[1] {
		t.Errorf("conditions changed in a steady state: %+v, were %+v", again, conditions)
	}
	if after := raftIndex(t, n.serverAddr); after != indexBefore {
		t.Errorf("raft index went from %d to %d in a steady state", indexBefore, after)
	}
	if after := events.String(); after != eventsBefore {
		t.Errorf("events of v1 in a steady state:\n%s", strings.TrimPrefix(after, eventsBefore))
	}

	n.controller.SetVolumeCondition(vol.ExternalID, false, "")
	n.node.SetVolumeCondition(vol.ExternalID, false, "")
	testutil.WaitFor(t, 60*time.Second, "a volume-normal event of each source", func() bool {
		return len(eventsOfType(t, events.String(), "volume-normal")) == 2
	})
	if c := volumeConditions(t, n.serverAddr, "v1"); len(c) != 0 {
		t.Errorf("conditions back to normal: %+v", c)
	}
	if m := httpGet(t, n.serverHTTP, "/metrics"); !regexp.MustCompile(`(?m)^csisupd_cluster_volumes_abnormal 0$`).MatchString(m) {
		t.Errorf("metrics: csisupd_cluster_volumes_abnormal is not 0 back to normal")
	}
}

// conditionDoc is a volume's recorded health condition in volume status
// --json.
type conditionDoc struct {
	Source  string `json:"source"`
	Message string `json:"message"`
	Since   string `json:"since"`
}

// volumeConditions returns the conditions volume status records for id.
func volumeConditions(t *testing.T, addr, id string) []conditionDoc {
	t.Helper()
	var v struct {
		Conditions []conditionDoc `json:"conditions"`
	}
	cliJSON(t, addr, &v, "volume", "status", id)
	return v.Conditions
}

// eventsOfType returns the events of typ among JSON lines.
func eventsOfType(t *testing.T, lines, typ string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(lines) {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("event line %q: %v", line, err)
		}
		if e["type"] == typ {
			out = append(out, e)
		}
	}
	return out
}

// followCLI runs a following CLI command (events) in the background for
// the rest of the test and returns its output so far, as it grows.
func followCLI(t *testing.T, addr string, args ...string) *testutil.SyncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, binary, append([]string{"--address", addr}, args...)...)
	cmd.Env = cleanEnv()
	var out testutil.SyncBuffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	return &out
}

// raftIndex is the raft index of the server's state, as volume list
// answers it.
func raftIndex(t *testing.T, addr string) uint64 {
	t.Helper()
	var l struct {
		Index uint64 `json:"index,string"`
	}
	cliJSON(t, addr, &l, "volume", "list")
	if l.Index == 0 {
		t.Fatal("volume list --json has no index")
	}
	return l.Index
}
