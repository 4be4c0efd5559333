//go:build nemesis

package nemesis

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin/journal"
	"github.com/csisupd/csisupd/internal/testutil"
)

// A defect is a deliberate bug that a build tag puts into csisupd, and
// the check of the soak that must catch it.
type defect struct {
	name  string
	tag   string
	check string
	// kinds are the faults that let it show (nil: every kind).
	kinds []string
	// withoutPublish runs the shared plugin without controller publish
	// (RunConfig.SharedWithoutPublish).
	withoutPublish bool
}

// defects are the deliberate bugs of the defect builds (each a
// nemesis_defect_* build tag in the package the bug is in), one for each
// check of the soak.
var defects = []defect{
	// The FSM and the leader admit a second writer on another node...
	{name: "single_writer", tag: "nemesis_defect_single_writer", check: journal.CheckSingleWriter, kinds: []string{faultSlowPlugin}},
	// ...and a single-node volume on a second node, when no controller
	// publish refuses it (the test plugin's controller does, as CSI
	// asks).
	{name: "single_node", tag: "nemesis_defect_single_writer", check: journal.CheckSingleNode, kinds: []string{faultSlowPlugin}, withoutPublish: true},
	// A restarted agent forgets its mount records and takes the servers'
	// release for done without unmounting.
	{name: "forget_record", tag: "nemesis_defect_forget_record", check: journal.CheckLeftovers, kinds: []string{faultKillAgent}},
	// The agent's release skips NodeUnpublishVolume.
	{name: "skip_unpublish", tag: "nemesis_defect_skip_unpublish", check: journal.CheckLeftovers, kinds: []string{faultSlowPlugin}},
	// The agent refuses to release a mount while another mount of the
	// volume on the node shares its staging: releases that never finish.
	{name: "busy_release", tag: "nemesis_defect_busy_release", check: checkDrain, kinds: []string{faultSlowPlugin}},
	// Control.ReleaseVolume acknowledges a release it never did.
	{name: "ack_release", tag: "nemesis_defect_ack_release", check: checkHistory, kinds: []string{faultSlowPlugin}},
	// A server panics on its 25th release.
	{name: "panic", tag: "nemesis_defect_panic", check: checkExit, kinds: []string{faultSlowPlugin}},
	// Every mount leaks goroutines in the agent.
	{name: "leak", tag: "nemesis_defect_leak", check: checkUsage, kinds: []string{faultSlowPlugin}},
	// The leader never expires a lease: a leased claim no longer renewed
	// stays taken.
	{name: "lease_never_expires", tag: "nemesis_defect_lease_never_expires", check: checkLease, kinds: []string{faultSlowPlugin}},
}

// Bounds of the defect runs: a defect shows within a minute of
// claims, and its leftovers never heal.
const (
	defectRun   = time.Minute
	defectQuiet = 45 * time.Second
	defectSeeds = 3
)

// TestDefects builds csisupd with each deliberate defect and runs the soak
// on it until the check meant for the defect reports a violation, within
// defectSeeds seeds (make nemesis-defects). It fails when a check stays
// blind to its defect: a change that made the invariants unable to see a
// bug would pass the soak silently otherwise. The defects' soaks run side
// by side, -nemesis-parallel at a time, each on a lab of its own, and each
// ends as soon as its check has caught its defect.
func TestDefects(t *testing.T) {
	t.Parallel()
	dir := t.TempDir() // removed with the test
	bins := map[string]string{}
	for _, d := range defects {
		bins[d.tag] = filepath.Join(dir, "csisupd-"+d.tag)
	}
	// Each build once, before any soak: two defects share a tag.
	for tag, bin := range bins {
		if err := testutil.Build("github.com/csisupd/csisupd/cmd/csisupd", false, tag, bin); err != nil {
			t.Fatalf("build with %s: %v", tag, err)
		}
	}
	slots := make(chan struct{}, max(1, *nemesisParallel))
	for _, d := range defects {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			slots <- struct{}{}
			defer func() { <-slots }()
			first := *seedFlag
			if first == 0 {
				first = 1
			}
			for i := range int64(defectSeeds) {
				seed := first + i
				var r *Report
				t.Run("seed="+strconv.FormatInt(seed, 10), func(t *testing.T) {
					r = Run(t, RunConfig{Seed: seed, Duration: defectRun, Kinds: d.kinds, Bin: bins[d.tag], QuietBound: defectQuiet,
						SharedWithoutPublish: d.withoutPublish, Until: d.check})
				})
				if r != nil && r.Violated(d.check) {
					t.Logf("%s caught by %s with seed %d:\n%s", d.tag, d.check, seed, firstOf(r.Violations, d.check))
					return
				}
			}
			t.Errorf("%s: no %s violation in %d seeds from %d: the check is blind to its defect", d.tag, d.check, defectSeeds, first)
		})
	}
}

// firstOf returns the first violation of check.
func firstOf(violations []string, check string) string {
	for _, v := range violations {
		if strings.HasPrefix(v, check+":") {
			return v
		}
	}
	return ""
}
