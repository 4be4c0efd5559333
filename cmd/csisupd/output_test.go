package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestVolumeStatusSpeaksTheOperatorsLanguage checks that the human output
// prints what the operator typed: the access mode as the flag spells it,
// the capacity in binary units, and the node's name beside its id.
func TestVolumeStatusSpeaksTheOperatorsLanguage(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	run := runAt(t, addr)

	run("volume", "create", "data", "--plugin", "tp", "--capacity", "20GiB", "--access-mode", "single-node-writer")
	node := a.Name + " (" + a.NodeID() + ")"
	if out := run("volume", "claim", "data", "--node", a.Name, "--workload", "job-1"); !strings.HasPrefix(out,
		"Claimed volume data for workload job-1 on node "+node+" (taken, single-node-writer)\n") {
		t.Errorf("volume claim: %q", out)
	}
	if out, err := execute(t, "--address", a.RPCAddr, "status"); err != nil || !strings.Contains(out, "\nNode:       "+node+", registered with ") {
		t.Errorf("status of the agent: %v, want its node as %q:\n%s", err, node, out)
	}

	out := run("volume", "status", "data")
	for _, want := range []string{
		fieldLine("Capacity", "20 GiB"),
		fieldLine("Capability", "mount single-node-writer"),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("volume status lacks %q:\n%s", want, out)
		}
	}
	var claimRow string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "job-1") {
			claimRow = l
			break
		}
	}
	if !strings.HasPrefix(claimRow, node+"  ") || !strings.Contains(claimRow, " single-node-writer ") {
		t.Errorf("claim row %q: want it to start with %q and show single-node-writer:\n%s", claimRow, node, out)
	}
	if strings.Contains(out, "SINGLE_NODE_WRITER") || strings.Contains(out, "21474836480") {
		t.Errorf("volume status prints the API's spelling:\n%s", out)
	}

	if out := run("volume", "list"); !strings.Contains(out, " 20 GiB ") || !strings.Contains(out, node+"\n") {
		t.Errorf("volume list: want 20 GiB and %q:\n%s", node, out)
	}

	// The cluster's events name the claim's node by name too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events testutil.SyncBuffer
	root := newRootCommand()
	root.SetOut(&events)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"--address", addr, "events", "--cluster", "--volume", "data"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	testutil.WaitFor(t, 10*time.Second, "the volume-claimed event with the node's name", func() bool {
		for _, l := range strings.Split(events.String(), "\n") {
			if strings.Contains(l, " volume-claimed ") && strings.Contains(l, " "+node+" ") {
				return true
			}
		}
		return false
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("events --cluster: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("events --cluster did not stop within 10 s of its context's end")
	}

	// JSON keeps the API's names and exact bytes.
	vol := mustJSON(t, "--address", addr, "volume", "status", "data")
	if vol["capacity_bytes"] != "21474836480" {
		t.Errorf("JSON capacity_bytes %v, want \"21474836480\"", vol["capacity_bytes"])
	}
	if cl := vol["claims"].([]any); len(cl) != 1 || cl[0].(map[string]any)["node_id"] != a.NodeID() ||
		cl[0].(map[string]any)["usage"].(map[string]any)["access_mode"] != "SINGLE_NODE_WRITER" {
		t.Errorf("JSON claims %v", vol["claims"])
	}
}

// A size flag without a unit is refused with the unit it likely lacks;
// 0 and sizes with a unit are taken.
func TestSizeFlagNeedsAUnit(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "10", wantErr: "--capacity 10: did you mean 10GiB? sizes need a unit"},
		{in: " 1.5 ", wantErr: "--capacity 1.5: did you mean 1.5GiB? sizes need a unit"},
		{in: "0", want: 0},
		{in: "10B", want: 10},
		{in: "10GiB", want: 10 << 30},
		{in: "2Mi", want: 2 << 20},
	}
	for _, tt := range tests {
		got, err := parseSizeFlag("capacity", tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Errorf("parseSizeFlag(%q) = %d, %v; want an error starting %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseSizeFlag(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
	}

	// The command exits 1 (not 2: the call was well formed, its value
	// is not) before it dials anything.
	nobody := testutil.FreeAddr(t)
	for _, args := range [][]string{
		{"volume", "create", "x", "--plugin", "p", "--capacity", "10"},
		{"volume", "create", "x", "--plugin", "p", "--capacity", "1GiB", "--capacity-max", "10"},
		{"volume", "expand", "x", "--capacity", "10"},
	} {
		if code := run(append([]string{"--address", nobody}, args...)); code != exitError {
			t.Errorf("%s: exit code %d, want %d", strings.Join(args, " "), code, exitError)
		}
		_, err := execute(t, append([]string{"--address", nobody}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "did you mean 10GiB? sizes need a unit") {
			t.Errorf("%s: %v, want the unit hint", strings.Join(args, " "), err)
		}
	}
}

// Creating a volume that exists succeeds and says so when the spec is the
// same, and fails naming the first key that differs when it is not.
func TestCreateExistingVolume(t *testing.T) {
	_, addr := oneNodeCluster(t)
	cli := runAt(t, addr)
	create := []string{"volume", "create", "data", "--plugin", "tp", "--capacity", "2MiB", "--fs-type", "ext4", "--parameter", "tier=gold"}
	first := cli(create...)
	if !strings.HasPrefix(first, "Created volume data (plugin tp, external id ") {
		t.Fatalf("create: %q", first)
	}
	ext := mustJSON(t, "--address", addr, "volume", "status", "data")["external_id"].(string)
	if out := cli(create...); out != "Volume data already exists (plugin tp, external id "+ext+"): nothing to create\n" {
		t.Errorf("create again: %q", out)
	}
	if again := mustJSON(t, append([]string{"--address", addr}, create...)...); again["external_id"] != ext {
		t.Errorf("create again --json: %v", again)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"parameter", []string{"--capacity", "2MiB", "--fs-type", "ext4", "--parameter", "tier=silver"},
			"volume data already exists with another spec: parameter: the volume has tier=gold, the spec asks tier=silver"},
		{"capacity", []string{"--capacity", "1GiB", "--fs-type", "ext4", "--parameter", "tier=gold"},
			"volume data already exists with another spec: capacity: the volume has 2 MiB, the spec asks at least 1 GiB"},
		{"capability", []string{"--capacity", "2MiB", "--fs-type", "xfs", "--parameter", "tier=gold"},
			"volume data already exists with another spec: capability: the volume has mount single-node-writer ext4, the spec asks mount single-node-writer xfs"},
	}
	for _, tt := range tests {
		args := append([]string{"--address", addr, "volume", "create", "data", "--plugin", "tp"}, tt.args...)
		if _, err := execute(t, args...); err == nil || err.Error() != tt.want {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
		if code := run(args); code != exitError {
			t.Errorf("%s: exit code %d, want %d", tt.name, code, exitError)
		}
	}
}

// A `plugin drain --wait` interrupted says that the drain stays in force
// and how to end it; the drain does stay.
func TestDrainWaitInterrupted(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	cli := runAt(t, addr)
	cli("volume", "create", "data", "--plugin", "tp", "--capacity", "2MiB")
	cli("volume", "claim", "data", "--node", a.Name, "--workload", "w1")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		root := newRootCommand()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs([]string{"--address", addr, "--timeout", "1s", "plugin", "drain", "tp", "--node", a.Name, "--wait"})
		done <- root.ExecuteContext(ctx)
	}()
	started := time.Now()
	draining := "Draining on: " + a.Name + " (" + a.NodeID() + ")\n"
	// --timeout bounds each call of the wait, not the wait: it is still
	// waiting after twice its --timeout.
	testutil.WaitFor(t, 10*time.Second, "the drain waiting past its --timeout", func() bool {
		return strings.Contains(cli("plugin", "status", "tp"), draining) && time.Since(started) > 2*time.Second
	})
	select {
	case err := <-done:
		t.Fatalf("drain --wait returned before the interrupt: %v", err)
	default:
	}
	cancel() // as Ctrl-C cancels the wait's context
	select {
	case err := <-done:
		want := "interrupted: stopped waiting, but the drain of plugin tp on node " + a.Name + " stays in force " +
			"(the node refuses new claims of its volumes); end it with `csisupd plugin drain tp --node " + a.Name + " --cancel`"
		if err == nil || err.Error() != want {
			t.Errorf("interrupted drain --wait: %v, want %q", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("drain --wait did not return within 10s of the interrupt")
	}
	if out := cli("plugin", "status", "tp"); !strings.Contains(out, draining) {
		t.Errorf("the drain ended with the wait:\n%s", out)
	}
	cli("plugin", "drain", "tp", "--node", a.Name, "--cancel")
	if out := cli("plugin", "status", "tp"); strings.Contains(out, "Draining on") {
		t.Errorf("the drain did not end with --cancel:\n%s", out)
	}
}
