//go:build fault

package e2e

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestSecretsFileAcrossSIGHUP runs real agents whose plugins refuse every
// CSI call without a token that only the agents' secrets files hold. The
// claim and its release work; with the node's file removed and SIGHUP
// sent, the next release fails with the plugin's own error and the claim
// stays releasing with it as last_error; with the file back and SIGHUP
// again, the volume watcher's resumed release finishes. (NodeUnpublish and
// NodeUnstage carry no secrets in CSI, so the file removed is the one of
// the controller's agent.) The token is in
// no process output and no file of the server's data dir (raft log and
// snapshots).
func TestSecretsFileAcrossSIGHUP(t *testing.T) {
	token := "tok-" + secret(t, "token")
	secrets := map[string]string{"token": token}
	n := startClaimNodeWith(t, claimNodeOptions{grace: "1h", secrets: secrets})
	vol, claim, _ := n.createAndClaim(t)
	cliJSON(t, n.serverAddr, &vol, "volume", "release", "v1", "--node", "c0", "--workload", "w1")
	if len(vol.Claims) != 0 {
		t.Fatalf("claims after the release: %+v", vol.Claims)
	}
	cliJSON(t, n.serverAddr, &claim, "volume", "claim", "v1", "--node", "c0", "--workload", "w1")

	// The controller's file goes: ControllerUnpublishVolume now gets no
	// token.
	if err := os.Remove(n.serverSecrets); err != nil {
		t.Fatal(err)
	}
	n.server.reload(t)
	res := cli(t, n.serverAddr, "volume", "release", "v1", "--node", "c0", "--workload", "w1")
	if res.code == 0 || !strings.Contains(res.stderr, "Unauthenticated") {
		t.Fatalf("release without the controller's secrets: exit %d: %s%s; want the plugin's Unauthenticated", res.code, res.stdout, res.stderr)
	}
	var v volumeDoc
	cliJSON(t, n.serverAddr, &v, "volume", "status", "v1")
	if len(v.Claims) != 1 || !strings.Contains(v.Claims[0].LastError, "secret") || v.Claims[0].State == "taken" {
		t.Fatalf("claim after the failed release: %+v; want it releasing, with the plugin's refusal as last_error", v.Claims)
	}

	// The file is back: the watcher's release, which has no secrets of
	// its own, finishes with the agent's.
	writeSecretsFile(t, n.serverSecrets, secrets)
	n.server.reload(t)
	n.waitAllUndone(t, "v1", vol.ExternalID)

	for name, out := range map[string]string{"server": n.server.logs.String(), "client": n.client.logs.String()} {
		if strings.Contains(out, token) {
			t.Errorf("the %s agent's output shows the token", name)
		}
	}
	err := filepath.WalkDir(n.serverData, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(token)) {
			t.Errorf("%s holds the token", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// reload sends SIGHUP to the agent and waits until it has reloaded its
// configuration, wholly or (a secrets file gone) in part.
func (a *agentProcess) reload(t *testing.T) {
	t.Helper()
	reloads := func() int {
		out := a.logs.String()
		return strings.Count(out, "configuration reloaded") + strings.Count(out, "configuration partly reloaded")
	}
	before := reloads()
	if err := a.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, a.name+" reloaded", func() bool { return reloads() > before })
}
