package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestVolumeLeaseCommands claims with a lease and an owner, renews it by
// node name, and shows it in volume status: an out-of-range lease is a
// usage error naming --lease, and a lost workload exits 1 after the
// answer is printed.
func TestVolumeLeaseCommands(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	run := runAt(t, addr)
	run("volume", "create", "data", "--plugin", "tp", "--capacity", "1MiB")

	for _, lease := range []string{"1s", "25h"} {
		_, err := execute(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-1", "--lease", lease)
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "--lease") {
			t.Fatalf("--lease %s: %v, want a usage error naming --lease", lease, err)
		}
	}
	claim := mustJSON(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-1", "--lease", "30s", "--owner", "sched")
	if claim["lease_ttl"] != "30s" || claim["owner"] != "sched" || claim["lease_deadline"] == nil || claim["lease_renewed_at"] == nil {
		t.Fatalf("leased claim: %v", claim)
	}

	out := run("volume", "renew", "--node", a.Name, "--workload", "job-1")
	if !strings.Contains(out, "DEADLINE") || !strings.Contains(out, "data") || !strings.Contains(out, "job-1") || !strings.Contains(out, "30s") {
		t.Fatalf("renew: %q", out)
	}
	out, err := execute(t, "--address", addr, "--json", "volume", "renew", "--node", a.Name, "--workload", "job-1", "--workload", "gone")
	if !errors.Is(err, errLostWorkloads) || errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("renew with a lost workload: %v, want the lost-workloads error (exit 1)", err)
	}
	var resp struct {
		Renewed []map[string]any `json:"renewed"`
		Lost    []string         `json:"lost_workload_ids"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Renewed) != 1 || resp.Renewed[0]["deadline"] == nil ||
		len(resp.Lost) != 1 || resp.Lost[0] != "gone" {
		t.Fatalf("renew --json: %v, %s", err, out)
	}

	out = run("volume", "status", "data")
	if !strings.Contains(out, "Owners and leases") || !strings.Contains(out, "sched") || !strings.Contains(out, "30s") {
		t.Fatalf("volume status shows no owner and lease: %q", out)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "data")
	c0 := vol["claims"].([]any)[0].(map[string]any)
	if c0["owner"] != "sched" || c0["lease_ttl"] != "30s" || c0["lease_renewed_at"] == nil {
		t.Fatalf("volume status --json claim: %v", c0)
	}
	run("volume", "release", "data", "--node", a.Name, "--workload", "job-1")
}
