package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// The template unit and what the test replaces in its commands.
const (
	volumeUnit = "../../deploy/systemd/csisupd-volume@.service"
	// unitBinary is where the unit runs csisupd from.
	unitBinary = "/usr/local/bin/csisupd"
	// unitLinkDir is where the unit links the volumes.
	unitLinkDir = "/run/csisupd/volumes"
)

// unitCommand reads the command of key (ExecStart, ExecStop) from the
// template unit as systemd would run it for instance name: %i is the
// instance, the installed binary the test's, the link directory linkDir,
// and a "$VAR" word the words of env's VAR (none when it is unset), as
// systemd splits it. Anything else systemd would expand fails the test.
func unitCommand(t *testing.T, key, instance, linkDir string, env map[string]string) []string {
	t.Helper()
	data, err := os.ReadFile(volumeUnit)
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), key+"="); ok {
			if line != "" {
				t.Fatalf("%s has more than one %s=", volumeUnit, key)
			}
			line = v
		}
	}
	if line == "" {
		t.Fatalf("%s has no %s=", volumeUnit, key)
	}
	line = strings.ReplaceAll(line, "%i", instance)
	line = strings.ReplaceAll(line, unitLinkDir, linkDir)
	var args []string
	for _, w := range strings.Fields(line) {
		if name, ok := strings.CutPrefix(w, "$"); ok {
			args = append(args, strings.Fields(env[name])...)
			continue
		}
		if strings.ContainsAny(w, `%$"'\`) {
			t.Fatalf("%s: %s= word %q holds what this test does not expand as systemd would", volumeUnit, key, w)
		}
		args = append(args, w)
	}
	if args[0] != unitBinary {
		t.Fatalf("%s: %s= runs %s, want %s", volumeUnit, key, args[0], unitBinary)
	}
	args[0] = binary
	return args
}

// runUnitCommand runs a command of the unit with the environment the
// unit's EnvironmentFile would give it: CSISUPD_ADDR naming the local
// agent. It returns stdout, and stderr with the exit status on failure.
func runUnitCommand(t *testing.T, args []string, agentAddr string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(cleanEnv(), "CSISUPD_ADDR="+agentAddr)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), errors.New(err.Error() + ": " + errb.String())
	}
	return out.String(), nil
}

// TestSystemdVolumeUnit runs the template unit's ExecStart= and ExecStop=
// for instance data, as systemd would, against a real client agent with
// the test plugin: the start claims volume data for workload
// systemd-data with owner systemd and a lease, and links the host path,
// through which a file lands in the plugin's volume; the agent renews the
// lease; the stop releases the claim, so that nothing stays mounted, and
// removes the link.
func TestSystemdVolumeUnit(t *testing.T) {
	n := startClaimNode(t)
	var vol volumeDoc
	cliJSON(t, n.serverAddr, &vol, "volume", "create", "data", "--plugin", "tp")
	linkDir := filepath.Join(testutil.TempDir(t), "run", "volumes")
	start := unitCommand(t, "ExecStart", "data", linkDir, nil)
	stop := unitCommand(t, "ExecStop", "data", linkDir, nil)

	out, err := runUnitCommand(t, start, n.addr)
	if err != nil {
		t.Fatalf("ExecStart %v: %v", start, err)
	}
	type leasedClaim struct {
		claimDoc
		Owner          string `json:"owner"`
		LeaseTTL       string `json:"lease_ttl"`
		LeaseRenewedAt string `json:"lease_renewed_at"`
		LeaseDeadline  string `json:"lease_deadline"`
	}
	claims := func() []leasedClaim {
		t.Helper()
		var v struct {
			Claims []leasedClaim `json:"claims"`
		}
		cliJSON(t, n.serverAddr, &v, "volume", "status", "data")
		return v.Claims
	}
	got := claims()
	if len(got) != 1 {
		t.Fatalf("claims after ExecStart: %+v, want one", got)
	}
	c := got[0]
	if c.WorkloadID != "systemd-data" || c.Owner != "systemd" || c.LeaseTTL == "" || c.State != "taken" || c.HostPath == "" {
		t.Fatalf("claim after ExecStart: %+v, want workload systemd-data, owner systemd, a lease, taken", c)
	}
	if strings.TrimSpace(out) != c.HostPath {
		t.Fatalf("ExecStart printed %q, want the host path %s", out, c.HostPath)
	}
	link := filepath.Join(linkDir, "data")
	if target, err := os.Readlink(link); err != nil || target != c.HostPath {
		t.Fatalf("link %s -> %q, %v; want -> %s", link, target, err, c.HostPath)
	}
	wantMountPoints(t, n.node, true, c.HostPath)
	if err := os.WriteFile(filepath.Join(link, "f"), []byte("hi"), 0o644); err != nil {
		t.Fatalf("write through the link: %v", err)
	}
	if mounts(n.node) {
		stored := filepath.Join(n.node.Config().StateDir, "data", vol.ExternalID, "f")
		if b, err := os.ReadFile(stored); err != nil || string(b) != "hi" {
			t.Fatalf("the file written through the link, in the plugin's volume at %s: %q, %v", stored, b, err)
		}
	}

	// Nothing but the agent renews the lease: its renewals move the
	// claim's last renewal on, and the claim stays taken.
	renewedAt := func(c leasedClaim) time.Time {
		t.Helper()
		at, err := time.Parse(time.RFC3339Nano, c.LeaseRenewedAt)
		if err != nil {
			t.Fatalf("lease_renewed_at of %+v: %v", c, err)
		}
		return at
	}
	first := renewedAt(c)
	testutil.WaitFor(t, 60*time.Second, "the agent's renewal of the lease", func() bool {
		cs := claims()
		return len(cs) == 1 && cs[0].State == "taken" && renewedAt(cs[0]).After(first)
	})

	if _, err := runUnitCommand(t, stop, n.addr); err != nil {
		t.Fatalf("ExecStop %v: %v", stop, err)
	}
	if got := claims(); len(got) != 0 {
		t.Fatalf("claims after ExecStop: %+v, want none", got)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link after ExecStop: %v, want it removed", err)
	}
	if left := mountsLeft(t, n.node); len(left) != 0 || len(n.node.NodeVolumes()) != 0 {
		t.Fatalf("after ExecStop the node plugin holds %v, with %v still mounted", n.node.NodeVolumes(), left)
	}
}
