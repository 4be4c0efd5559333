//go:build fault

package soak

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// The soak's size, timing and budgets.
const (
	goodPlugins     = 20
	hostilePerKind  = 20
	hostileWindow   = 30 * time.Second
	maxRSSGrowth    = 32 << 20
	maxCPUPercent   = 25.0
	maxLatenessP99  = 50 * time.Millisecond
	baselineSamples = 5
)

var hostileTiming = timing{probeInterval: 500 * time.Millisecond, probeTimeout: 250 * time.Millisecond, deregisterGrace: 2 * time.Second}

// hostileKinds are the csi-hostile kinds started; only padded answers
// correctly.
var hostileKinds = []string{"maxframes", "huge", "padded", "goaway"}

// plainAgent is the agent built without the race detector, whatever the
// test binary: this test measures the production build's memory and CPU,
// which the race detector inflates several times.
var plainAgent lazyBuild

// TestHostilePluginsDoNotStallSupervision runs the agent with 20 plugins
// that behave and 80 that attack the supervision connection (20 each of
// maxframes, huge, padded and goaway) for 30 s, and checks that the agent's
// memory and CPU stay within budget, that the good plugins are probed on
// time and stay healthy, and that each hostile plugin ends in the state its
// behaviour earns.
func TestHostilePluginsDoNotStallSupervision(t *testing.T) {
	bin := agentBin
	if raceEnabled {
		bin = plainAgent.get(t, "csisupd-norace", agentPkg, false)
	}
	dir := testutil.TempDir(t)
	probeLog := filepath.Join(dir, "probes.log")
	a := startAgent(t, bin, dir, hostileTiming)
	pid := a.Pid()

	good := testutil.StartProcess(t, nil, testPluginBin, "--dir", a.pluginDir, "--count", strconv.Itoa(goodPlugins),
		"--state-dir", filepath.Join(dir, "state"), "--node-id", "n1", "--probe-log", probeLog)
	good.WaitOutput(t, "csi-testplugin: serving", 30*time.Second)
	goodIDs := make([]string, goodPlugins)
	for i := range goodIDs {
		goodIDs[i] = fmt.Sprintf("p%04d", i)
	}
	allHealthy := func(ps map[string]*csisupdv1.Plugin) bool {
		for _, id := range goodIDs {
			if !ps[id].GetHealthy() {
				return false
			}
		}
		return true
	}
	a.waitPlugins(t, 30*time.Second, "all good plugins healthy", allHealthy)

	// Baseline: the agent with good plugins only, sampled every half
	// probe interval over two probe rounds; the largest sample, so the
	// garbage collector's sawtooth is part of the baseline, not of the
	// growth.
	var baseline int64
	cpu0, t0 := testutil.ProcessCPU(t, pid), time.Now()
	for i := range baselineSamples {
		if i > 0 {
			time.Sleep(hostileTiming.probeInterval / 2) // sampling period
		}
		baseline = max(baseline, testutil.ProcessRSS(t, pid))
	}
	baseCPU := cpuPercent(testutil.ProcessCPU(t, pid)-cpu0, time.Since(t0))
	t.Logf("baseline with %d good plugins: RSS %s, CPU %.1f%% of one core", goodPlugins, mib(baseline), baseCPU)

	var hostileIDs []string
	for _, kind := range hostileKinds {
		p := testutil.StartProcess(t, nil, hostileBin, "--dir", a.pluginDir, "--kind", kind, "--count", strconv.Itoa(hostilePerKind))
		p.WaitOutput(t, fmt.Sprintf("csi-hostile: serving %d", hostilePerKind), 30*time.Second)
		for i := range hostilePerKind {
			hostileIDs = append(hostileIDs, fmt.Sprintf("h-%s-%04d", kind, i))
		}
	}

	// The window: RSS and status every second, CPU over the whole.
	windowStart := time.Now()
	cpuStart := testutil.ProcessCPU(t, pid)
	var (
		rssSamples  []int64
		unhealthy   []string // good plugins seen not healthy, with when
		statusFails []string // ListPlugins calls that failed
		allListed   time.Duration
		last        map[string]*csisupdv1.Plugin
	)
	tick := time.NewTicker(time.Second)
	for range tick.C {
		elapsed := time.Since(windowStart)
		if a.Exited() {
			tick.Stop()
			t.Fatalf("agent exited with %d %s into the window:\n%s", a.ExitCode(), elapsed, a.Stderr)
		}
		rssSamples = append(rssSamples, testutil.ProcessRSS(t, pid))
		ps, err := a.plugins()
		if err != nil {
			statusFails = append(statusFails, fmt.Sprintf("%s: %v", elapsed.Round(time.Millisecond), err))
		} else {
			last = ps
			for _, id := range goodIDs {
				if p := ps[id]; !p.GetHealthy() {
					unhealthy = append(unhealthy, fmt.Sprintf("%s at %s: %s %q", id, elapsed.Round(time.Millisecond), p.GetHealthState(), p.GetHealthDescription()))
				}
			}
			if allListed == 0 && listsAll(ps, hostileIDs) {
				allListed = elapsed
			}
		}
		if elapsed >= hostileWindow {
			break
		}
	}
	tick.Stop()
	windowEnd := time.Now()
	cpu := cpuPercent(testutil.ProcessCPU(t, pid)-cpuStart, windowEnd.Sub(windowStart))
	window := windowEnd.Sub(windowStart)

	// Memory.
	peak := slices.Max(rssSamples)
	t.Logf("RSS over %s with %d hostile plugins: %d samples, min %s, max %s, last %s; growth over baseline %s (budget %s)",
		window.Round(time.Millisecond), len(hostileIDs), len(rssSamples), mib(slices.Min(rssSamples)), mib(peak),
		mib(rssSamples[len(rssSamples)-1]), mib(peak-baseline), mib(maxRSSGrowth))
	t.Logf("RSS samples (MiB): %s", formatMiB(rssSamples))
	if peak-baseline > maxRSSGrowth {
		t.Errorf("agent RSS grew %s over its baseline %s (peak %s), want at most %s", mib(peak-baseline), mib(baseline), mib(peak), mib(maxRSSGrowth))
	}

	// CPU.
	t.Logf("CPU over the window: %.1f%% of one core (budget %.0f%%, baseline %.1f%%)", cpu, maxCPUPercent, baseCPU)
	if cpu >= maxCPUPercent {
		t.Errorf("agent used %.1f%% of one core over the window, want under %.0f%%", cpu, maxCPUPercent)
	}

	// Status answers and the good plugins' health.
	if allListed > 0 {
		t.Logf("all %d hostile plugins listed %s into the window", len(hostileIDs), allListed.Round(time.Millisecond))
	}
	if len(statusFails) > 0 {
		t.Errorf("ListPlugins failed %d times during the window (agent not answering):\n  %s", len(statusFails), strings.Join(statusFails, "\n  "))
	}
	if len(unhealthy) > 0 {
		t.Errorf("good plugins not healthy during the window (%d samples):\n  %s", len(unhealthy), strings.Join(unhealthy, "\n  "))
	} else {
		t.Logf("all %d good plugins healthy in every sample", goodPlugins)
	}

	// Probe punctuality of the good plugins, from the probe log. Its
	// lines reach the file within 100 ms; wait until every good plugin
	// has a probe after the window, which also closes each plugin's last
	// gap in the window.
	var probes map[string][]time.Time
	deadline := time.Now().Add(5 * hostileTiming.probeInterval)
	for {
		probes = readProbeLog(t, probeLog)
		if probedAfter(probes, goodIDs, windowEnd) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // poll interval of a file flushed every 100 ms
	}
	late, counts := lateness(probes, goodIDs, windowStart, windowEnd, time.Now(), hostileTiming.probeInterval)
	if len(late) == 0 {
		t.Errorf("no probe gaps of the good plugins in the window; probes per plugin: %v", counts)
	} else {
		p50, p99, worst := percentile(late, 50), percentile(late, 99), slices.Max(late)
		t.Logf("probe lateness of the good plugins over %d gaps: p50 %s, p99 %s, max %s (budget p99 %s); probes per plugin in the window: min %d, max %d",
			len(late), p50, p99, worst, maxLatenessP99, slices.Min(counts), slices.Max(counts))
		if p99 >= maxLatenessP99 {
			t.Errorf("probe lateness p99 %s, want under %s", p99, maxLatenessP99)
		}
	}
	if !probedAfter(probes, goodIDs, windowEnd) {
		t.Errorf("not every good plugin was probed within %s after the window", 5*hostileTiming.probeInterval)
	}

	// The hostile plugins' final state: padded ones answer correctly and
	// are healthy, the others unhealthy with a reason.
	if last == nil {
		t.Fatal("ListPlugins never answered during the window")
	}
	t.Logf("hostile plugins at the end of the window:\n%s", describe(only(last, hostileIDs)))
	for _, id := range hostileIDs {
		p := last[id]
		switch {
		case p == nil:
			t.Errorf("%s is not registered", id)
		case strings.HasPrefix(id, "h-padded-"):
			if !p.GetHealthy() {
				t.Errorf("%s is %s %q, want healthy: it answers correctly", id, p.GetHealthState(), p.GetHealthDescription())
			}
		case p.GetHealthState() != "unhealthy" || p.GetHealthDescription() == "":
			t.Errorf("%s is %s %q, want unhealthy with a description", id, p.GetHealthState(), p.GetHealthDescription())
		}
	}

	// The agent still stops promptly.
	termAt := time.Now()
	a.Signal(t, syscall.SIGTERM)
	code := a.Wait(t, 30*time.Second)
	took := time.Since(termAt)
	t.Logf("agent exited %d after SIGTERM in %s", code, took.Round(time.Millisecond))
	if code != 0 || took > 5*time.Second {
		t.Errorf("agent exited %d %s after SIGTERM, want 0 within 5s", code, took)
	}
	// startAgent's cleanup checks the agent's whole output for panics
	// and data races.
}

func cpuPercent(cpu, wall time.Duration) float64 {
	return 100 * cpu.Seconds() / wall.Seconds()
}

func formatMiB(samples []int64) string {
	s := make([]string, len(samples))
	for i, b := range samples {
		s[i] = fmt.Sprintf("%.1f", float64(b)/(1<<20))
	}
	return strings.Join(s, " ")
}

// listsAll reports whether every id is listed.
func listsAll(ps map[string]*csisupdv1.Plugin, ids []string) bool {
	for _, id := range ids {
		if ps[id] == nil {
			return false
		}
	}
	return true
}

// only returns the plugins among ps with the given ids.
func only(ps map[string]*csisupdv1.Plugin, ids []string) map[string]*csisupdv1.Plugin {
	out := make(map[string]*csisupdv1.Plugin, len(ids))
	for _, id := range ids {
		if p := ps[id]; p != nil {
			out[id] = p
		}
	}
	return out
}
