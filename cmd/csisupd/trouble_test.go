package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestStuckVolumeCommands drives the commands of the "When volumes are
// stuck" runbook against one server and one agent.
func TestStuckVolumeCommands(t *testing.T) {
	c, addr, plugins := oneNodeClusterWith(t, map[string]testplugin.Config{"tp": {NodeID: "csi-a", VolumeHealth: true,
		ControllerCapabilities: testplugin.SupportedControllerCapabilities}})
	a := c.Agent(0)
	run := runAt(t, addr)
	fail := func(want string, args ...string) {
		t.Helper()
		if _, err := execute(t, append([]string{"--address", addr}, args...)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want an error saying %q", strings.Join(args, " "), err, want)
		}
	}
	run("volume", "create", "data", "--plugin", "tp", "--capacity", "1MiB", "--access-mode", "multi-node-multi-writer")
	run("volume", "claim", "data", "--node", a.Name, "--workload", "w1")

	// Availability.
	if out := run("volume", "availability", "data", "pause"); !strings.Contains(out, "data") {
		t.Fatalf("availability pause: %q", out)
	}
	if out := run("volume", "status", "data"); !strings.Contains(out, "Availability:") || !strings.Contains(out, "pause") {
		t.Fatalf("volume status of a paused volume: %q", out)
	}
	fail("claim refused (availability)", "volume", "claim", "data", "--node", a.Name, "--workload", "w2")
	run("volume", "availability", "data", "active")
	fail("want active, pause or drain", "volume", "availability", "data", "paused")

	// The cluster's events of the volume, as the runbook follows a drain.
	availability := 0
	for _, line := range watchLines(t, addr, []string{"events", "--cluster", "--volume", "data", "--json"}, "volume-claimed", "volume-availability") {
		var e struct {
			Type     string `json:"type"`
			VolumeID string `json:"volume_id"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --cluster line %q: %v", line, err)
		}
		if e.VolumeID != "data" {
			t.Errorf("events --cluster --volume data printed %q", line)
		}
		if e.Type == "volume-availability" {
			availability++
		}
	}
	if availability != 2 {
		t.Errorf("events --cluster --volume data: %d volume-availability events, want 2 (pause, active)", availability)
	}
	fail("--volume needs --cluster", "events", "--volume", "data")
	fail("with --cluster use --index", "events", "--cluster", "--replay", "3")

	// Health, capacity, external listing.
	plugins["tp"].SetVolumeCondition(mustJSON(t, "--address", addr, "volume", "status", "data")["external_id"].(string), true, "bad sectors")
	if out := run("volume", "status", "data", "--health"); !strings.Contains(out, "Health now") || !strings.Contains(out, "abnormal") ||
		!strings.Contains(out, "bad sectors") {
		t.Fatalf("volume status --health: %q", out)
	}
	if out := run("plugin", "status", "tp", "--capacity"); !strings.Contains(out, "Capacity") || !strings.Contains(out, "1024.0 TiB") {
		t.Fatalf("plugin status --capacity: %q", out)
	}
	conn, err := grpc.NewClient("unix://"+plugins["tp"].Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "stray", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}}}); err != nil {
		t.Fatal(err)
	}
	out := run("volume", "list", "--plugin", "tp", "--external")
	if !strings.Contains(out, "known") || !strings.Contains(out, "unknown") {
		t.Fatalf("volume list --external: %q", out)
	}
	fail("--external needs --plugin", "volume", "list", "--external")

	// Plugin drain.
	if out := run("plugin", "drain", "tp", "--node", a.Name); !strings.Contains(out, "drains") || !strings.Contains(out, "1 claims, 1 mounts left") {
		t.Fatalf("plugin drain: %q", out)
	}
	if out := run("plugin", "status", "tp"); !strings.Contains(out, "Draining on: "+a.Name+" ("+a.NodeID()+")\n") {
		t.Fatalf("plugin status while draining: %q", out)
	}
	// --wait returns only after the last claim is released: the drain
	// is ended, and the waiting command starts it again before the release.
	run("plugin", "drain", "tp", "--node", a.Name, "--cancel")
	var released atomic.Bool
	done := make(chan string, 1)
	go func() {
		out, err := execute(t, "--address", addr, "plugin", "drain", "tp", "--node", a.Name, "--wait", "--wait-timeout", "30s")
		if err != nil {
			out = err.Error()
		}
		if !released.Load() {
			out = "returned before the release: " + out
		}
		done <- out
	}()
	testutil.WaitFor(t, 10*time.Second, "the waiting drain started", func() bool {
		return strings.Contains(run("plugin", "status", "tp"), "Draining on: "+a.Name+" ("+a.NodeID()+")\n")
	})
	released.Store(true)
	run("volume", "release", "data", "--node", a.Name, "--workload", "w1")
	if out := <-done; !strings.Contains(out, "0 claims, 0 mounts left") || strings.HasPrefix(out, "returned before") {
		t.Fatalf("drain --wait: %q", out)
	}
	run("plugin", "drain", "tp", "--node", a.Name, "--cancel")

	// Force: refused on a node that answers; deregister --force prints
	// what it leaves.
	run("volume", "claim", "data", "--node", a.Name, "--workload", "w3")
	fail("--force twice", "volume", "release", "data", "--node", a.Name, "--force")
	fail("not 3 times", "volume", "release", "data", "--node", a.Name, "--force", "--force", "--force")
	if out := run("volume", "deregister", "data", "--force"); !strings.Contains(out, "Left behind (1 claims") || !strings.Contains(out, "w3") {
		t.Fatalf("deregister --force: %q", out)
	}
}
