package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const claimSpec = `plugin_id = "tp"
capacity_min = "1MiB"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
`

func writeSpec(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestClaimCreateRequest checks the create a --create-from file makes: no
// id (the claim names the volume), the file's plugin and capacity; a file
// naming another volume is a usage error naming both.
func TestClaimCreateRequest(t *testing.T) {
	req, err := claimCreateRequest(writeSpec(t, "any.hcl", claimSpec), "scratch", nil)
	if err != nil {
		t.Fatal(err)
	}
	if req.GetId() != "" || req.GetPluginId() != "tp" || req.GetCapacityMinBytes() != 1<<20 || len(req.GetCapabilities()) != 1 {
		t.Errorf("create of a file without id: %v, want no id, plugin tp, 1 MiB and its capability", req)
	}
	if _, err := claimCreateRequest(writeSpec(t, "same.hcl", `id = "scratch"`+"\n"+claimSpec), "scratch", nil); err != nil {
		t.Errorf("a file with the claimed volume's id: %v", err)
	}
	_, err = claimCreateRequest(writeSpec(t, "other.hcl", `id = "database"`+"\n"+claimSpec), "scratch", nil)
	if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), `"database"`) || !strings.Contains(err.Error(), `"scratch"`) {
		t.Errorf("a file of another volume: %v, want a usage error naming database and scratch", err)
	}
}

// TestVolumeClaimCreateFrom claims a volume that does not exist with
// --create-from and --ephemeral against a real cluster: the claim creates
// it, it is ephemeral, and its release deletes it. --ephemeral without
// --create-from is a usage error (exit 2).
func TestVolumeClaimCreateFrom(t *testing.T) {
	if got := run([]string{"volume", "claim", "scratch", "--node", "n", "--workload", "w", "--ephemeral"}); got != exitUsage {
		t.Errorf("--ephemeral without --create-from: exit %d, want %d", got, exitUsage)
	}
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	spec := writeSpec(t, "scratch.hcl", claimSpec)
	claim := mustJSON(t, "--address", addr, "volume", "claim", "scratch", "--node", a.Name, "--workload", "job-1",
		"--create-from", spec, "--ephemeral")
	if claim["state"] != "taken" || claim["host_path"] == "" || claim["workload_id"] != "job-1" {
		t.Fatalf("claim with --create-from: %v", claim)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "scratch")
	if vol["ephemeral"] != true || vol["plugin_id"] != "tp" {
		t.Fatalf("the created volume: %v, want it ephemeral on plugin tp", vol)
	}
	if out := runAt(t, addr)("volume", "release", "scratch", "--node", a.NodeID(), "--workload", "job-1"); !strings.Contains(out, "Volume scratch is ephemeral: its last claim is released, so it is deleted") {
		t.Fatalf("release of the last claim of an ephemeral volume: %q, want it to say the volume is deleted", out)
	}
	if _, err := execute(t, "--address", addr, "volume", "status", "scratch"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("volume status after the last release of an ephemeral volume: %v, want not found", err)
	}
}
