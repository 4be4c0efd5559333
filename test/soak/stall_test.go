package soak

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// stallTiming is fast probing so the whole test takes a few seconds.
var stallTiming = timing{probeInterval: 200 * time.Millisecond, probeTimeout: 100 * time.Millisecond, deregisterGrace: 500 * time.Millisecond}

// schedulingMargin is what a stalled plugin's detection may take beyond the
// probe timeout plus one interval: goroutine and timer scheduling of a busy
// (possibly race-instrumented) agent, and file system event delivery.
const schedulingMargin = 200 * time.Millisecond

// pollSlack is what our own polling adds to a change we observe through
// ListPlugins: the poll interval and one call.
const pollSlack = 100 * time.Millisecond

// Two plugins that stall — a real plugin process stopped with SIGSTOP and
// a socket that accepts but never reads — are found unhealthy within one
// probe timeout plus one interval, stall neither the supervision of a
// plugin started afterwards nor the deregistration of their removed
// sockets, and do not keep the agent from stopping on SIGTERM.
func TestStalledPluginsDoNotStallSupervision(t *testing.T) {
	dir := testutil.TempDir(t)
	a := startAgent(t, agentBin, dir, stallTiming)
	t.Logf("agent race detector: %v", raceEnabled)

	const stoppedID, stallID, lateID = "stopped", "h-stall-0000", "late"
	stoppedSock := filepath.Join(a.pluginDir, stoppedID, "csi.sock")
	stallSock := filepath.Join(a.pluginDir, stallID, "csi.sock")
	lateSock := filepath.Join(a.pluginDir, lateID, "csi.sock")

	stopped := testutil.StartProcess(t, nil, testPluginBin, "--socket", stoppedSock, "--node-id", "n1",
		"--state-dir", filepath.Join(dir, "state-"+stoppedID))
	stopped.WaitOutput(t, "csi-testplugin: serving", 10*time.Second)
	a.waitPlugins(t, 10*time.Second, stoppedID+" healthy", func(ps map[string]*csisupdv1.Plugin) bool {
		return ps[stoppedID].GetHealthy()
	})

	// Both stall now. The stall socket is stalled from the moment it
	// listens, which is after its process started: taking the start as
	// the stall instant can only overstate its detection time.
	stalledAt := map[string]time.Time{stallID: time.Now()}
	hostile := testutil.StartProcess(t, nil, hostileBin, "--dir", a.pluginDir, "--kind", "stall", "--count", "1")
	stalledAt[stoppedID] = time.Now()
	stopped.Signal(t, syscall.SIGSTOP)
	hostile.WaitOutput(t, "csi-hostile: serving 1", 10*time.Second)

	limit := stallTiming.probeTimeout + stallTiming.probeInterval + schedulingMargin
	stalled := []string{stoppedID, stallID}
	seenAt, seen := a.waitEach(t, 5*time.Second, "stalled plugins unhealthy", stalled, func(p *csisupdv1.Plugin) bool {
		return p.GetHealthState() == "unhealthy"
	})
	for _, id := range stalled {
		since := seen[id].GetHealthSince().AsTime()
		byAgent, observed := since.Sub(stalledAt[id]), seenAt[id].Sub(stalledAt[id])
		t.Logf("%s: unhealthy %s after it stalled by the agent's health_since, observed after %s: %q",
			id, byAgent.Round(time.Millisecond), observed.Round(time.Millisecond), seen[id].GetHealthDescription())
		if byAgent < 0 && id == stoppedID {
			t.Errorf("%s turned unhealthy %s before it was stopped", id, -byAgent)
		}
		if byAgent > limit || observed > limit+pollSlack {
			t.Errorf("%s turned unhealthy %s (observed %s) after it stalled, want <= probe_timeout + interval + %s = %s",
				id, byAgent, observed, schedulingMargin, limit)
		}
		if seen[id].GetHealthDescription() == "" {
			t.Errorf("%s is unhealthy without a description", id)
		}
	}

	// A plugin that arrives while the two hang is supervised at once.
	lateStart := time.Now()
	late := testutil.StartProcess(t, nil, testPluginBin, "--socket", lateSock, "--node-id", "n1",
		"--state-dir", filepath.Join(dir, "state-"+lateID))
	lateReady := late.WaitOutput(t, "csi-testplugin: serving", 10*time.Second)
	healthyAt, ps := a.waitPlugins(t, 10*time.Second, lateID+" healthy", func(ps map[string]*csisupdv1.Plugin) bool {
		return ps[lateID].GetHealthy()
	})
	t.Logf("%s: healthy %s after it listened (%s after its process started)", lateID,
		healthyAt.Sub(lateReady).Round(time.Millisecond), healthyAt.Sub(lateStart).Round(time.Millisecond))
	if took := healthyAt.Sub(lateReady); took > time.Second {
		t.Errorf("%s registered and healthy %s after it listened, want <= 1s", lateID, took)
	}
	for _, id := range stalled {
		if p := ps[id]; p == nil || p.GetHealthy() {
			t.Errorf("while %s started, %s is %v, want still registered and unhealthy", lateID, id, p)
		}
	}

	// Removing the stalled plugins' sockets deregisters them after the
	// grace period, though one of them cannot even be closed politely.
	removedAt := time.Now()
	for _, sock := range []string{stoppedSock, stallSock} {
		if err := os.Remove(sock); err != nil {
			t.Fatal(err)
		}
	}
	grace := stallTiming.deregisterGrace
	goneAt, _ := a.waitEach(t, grace+5*time.Second, "removed plugins deregistered", stalled, func(p *csisupdv1.Plugin) bool {
		return p == nil
	})
	for _, id := range stalled {
		took := goneAt[id].Sub(removedAt)
		t.Logf("%s: deregistered %s after its socket was removed (grace %s)", id, took.Round(time.Millisecond), grace)
		// The agent cannot learn of the removal before it happened, so
		// the lower bound needs no slack beyond timer granularity.
		if took < grace-10*time.Millisecond || took > grace+time.Second {
			t.Errorf("%s deregistered %s after its socket was removed, want between the grace %s and grace + 1s", id, took, grace)
		}
	}
	if p := a.mustPlugins(t)[lateID]; !p.GetHealthy() {
		t.Errorf("after the deregistrations %s is %v, want healthy", lateID, p)
	}

	// SIGTERM stops the agent promptly with the stopped plugin's process
	// still frozen, and the registry it leaves holds the remaining plugin.
	termAt := time.Now()
	a.Signal(t, syscall.SIGTERM)
	code := a.Wait(t, 10*time.Second)
	took := time.Since(termAt)
	t.Logf("agent exited %d after SIGTERM in %s", code, took.Round(time.Millisecond))
	if code != 0 || took > 5*time.Second {
		t.Errorf("agent exited %d %s after SIGTERM, want 0 within 5s", code, took)
	}
	data, err := os.ReadFile(filepath.Join(a.dataDir, "registry.json"))
	if err != nil {
		t.Fatalf("registry not persisted: %v", err)
	}
	var reg struct {
		Plugins []struct {
			ID string `json:"id"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &reg); err != nil {
		t.Fatalf("registry.json: %v\n%s", err, data)
	}
	var ids []string
	for _, p := range reg.Plugins {
		ids = append(ids, p.ID)
	}
	if !slices.Equal(ids, []string{lateID}) {
		t.Errorf("registry.json holds plugins %v, want [%s]", ids, lateID)
	}
	// startAgent's cleanup checks the agent's whole output for panics
	// and data races.
}
