package server_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestSecretsFromTheAgentsFiles runs every step that reaches a plugin
// long after its caller against a plugin that refuses any call without a
// token only the agents' secrets files hold: a claim and its release, a
// release the watcher resumes after a leader kill, a claim_gc_grace
// release and an expansion all succeed. Without the file (removed and
// reloaded), a release fails with the plugin's error, visible on the
// claim. The token is in no server file and no event.
func TestSecretsFromTheAgentsFiles(t *testing.T) {
	token := fmt.Sprintf("file-token-%d", time.Now().UnixNano())
	secretsFile := func(dir string) string { return filepath.Join(dir, "tp-secrets.hcl") }
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2,
		Configure: func(i int, cfg *server.Config) {
			fastVolumeWatcher(i, cfg)
			cfg.MinHeartbeatTTL, cfg.HeartbeatGrace = 300*time.Millisecond, 300*time.Millisecond
			cfg.ClaimGCGrace = time.Second
		},
		AgentConfig: func(_ int, dir string) string {
			if err := os.WriteFile(secretsFile(dir), []byte("default {\n  token = \""+token+"\"\n}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("plugin \"tp\" {\n  secrets_file = %q\n}\n", secretsFile(dir))
		},
	})
	cc := &claimCluster{c: c}
	for i, a := range c.Agents() {
		cc.plugins = append(cc.plugins, a.StartPlugin("tp", testplugin.Config{
			NodeID: fmt.Sprintf("csi-node-%d", i), RequiredSecrets: map[string]string{"token": token},
			ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME},
		}))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 2
	})
	ctx := context.Background()
	// The test plugin keeps a volume in the state of the controller that
	// made it, as node-local drivers do: that agent, keep, stays up; the
	// other, gone, is the node claim_gc_grace releases without.
	keep, gone := 0, 1
	if ctrl := cc.create(t, "v", "MULTI_NODE_MULTI_WRITER").GetControllerNodeId(); ctrl == c.Agent(1).NodeID() {
		keep, gone = 1, 0
	}

	// A claim and its release.
	if _, err := cc.claim(t, "v", keep, "w1", mnmw); err != nil {
		t.Fatalf("claim: %v", err)
	}
	if err := cc.release(t, "v", keep, "w1"); err != nil {
		t.Fatalf("release: %v", err)
	}

	// A release the watcher resumes after the leader died.
	if _, err := cc.claim(t, "v", keep, "w2", mnmw); err != nil {
		t.Fatal(err)
	}
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"ControllerUnpublishVolume": codes.Internal}})
	}
	if err := cc.release(t, "v", keep, "w2"); err == nil {
		t.Fatal("the release succeeded through a failing controller")
	}
	c.Kill(c.WaitForLeader(t, 30*time.Second).Index)
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{})
	}
	testutil.WaitFor(t, 30*time.Second, "the watcher's release of w2", func() bool { return len(cc.volume(t, "v").GetClaims()) == 0 })

	// An expansion.
	if _, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "v", CapacityMinBytes: 4 << 20}); err != nil {
		t.Fatalf("expand: %v", err)
	}

	// A claim_gc_grace release: the other agent goes away.
	if _, err := cc.claim(t, "v", gone, "w3", mnmw); err != nil {
		t.Fatal(err)
	}
	c.StopAgent(gone)
	testutil.WaitFor(t, 30*time.Second, "w3 released without its node", func() bool { return len(cc.volume(t, "v").GetClaims()) == 0 })

	// Without the file, the plugin refuses, and the claim says so.
	if _, err := cc.claim(t, "v", keep, "w4", mnmw); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(secretsFile(c.Agent(keep).Dir)); err != nil {
		t.Fatal(err)
	}
	_ = c.Agent(keep).Reload() // fails, naming the missing file; the secrets are dropped
	err := cc.release(t, "v", keep, "w4")
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("release without the secrets file = %v, want the plugin's Unauthenticated", err)
	}
	if cl := cc.volume(t, "v").GetClaims(); len(cl) != 1 || !strings.Contains(cl[0].GetLastError(), "needs secret") || cl[0].GetState() == "taken" {
		t.Errorf("claim after the refused release = %v, want it releasing with the plugin's error", cl)
	}
	if cl := cc.volume(t, "v").GetClaims(); len(cl) == 1 && strings.Contains(cl[0].GetLastError(), token) {
		t.Error("the claim's last error shows the token")
	}

	// The token reached the plugins, and nothing of the servers' holds it.
	seen := false
	for _, p := range cc.plugins {
		for _, s := range p.Secrets("ControllerUnpublishVolume") {
			seen = seen || s["token"] == token
		}
	}
	if !seen {
		t.Fatal("the plugins never got the token: the check below proves nothing")
	}
	// Every server snapshots its state, so that the raft snapshots are
	// checked as well as the log; so is an operator's snapshot file.
	snapshots, running := 0, 0
	for _, m := range c.Members() {
		if m.Server() != nil { // the killed leader is not
			running++
			if err := m.Server().Raft().Snapshot().Error(); err != nil {
				t.Fatalf("raft snapshot of %s: %v", m.ID, err)
			}
		}
		_ = filepath.WalkDir(m.DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if filepath.Base(path) == "state.bin" {
				snapshots++
			}
			if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), token) {
				t.Errorf("server file %s holds the token", path)
			}
			return nil
		})
	}
	if running == 0 || snapshots < running {
		t.Errorf("found %d raft snapshots in the servers' data dirs, want one a running server (%d) at least", snapshots, running)
	}
	if strings.Contains(string(saveSnapshot(t, cc.control(t))), token) {
		t.Error("the operator's snapshot file holds the token")
	}
	for _, e := range volumeEvents(t, cc.control(t), "v", func(e *csisupdv1.ClusterEvent) bool {
		return e.GetType() == "volume-claim-updated" && strings.Contains(e.GetDescription(), "w4")
	}) {
		if strings.Contains(e.String(), token) {
			t.Errorf("event %v holds the token", e)
		}
	}
}
