package soak

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readProbeLog parses csi-testplugin's --probe-log file: probe arrival
// times by plugin id, sorted. A half-written last line is skipped.
func readProbeLog(t *testing.T, path string) map[string][]time.Time {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("probe log: %v", err)
	}
	defer f.Close()
	out := make(map[string][]time.Time)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, ns, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil {
			continue
		}
		out[id] = append(out[id], time.Unix(0, n))
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("probe log: %v", err)
	}
	for _, ts := range out {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	}
	return out
}

// probedAfter reports whether every id has a probe after t.
func probedAfter(probes map[string][]time.Time, ids []string, t time.Time) bool {
	for _, id := range ids {
		ts := probes[id]
		if len(ts) == 0 || !ts[len(ts)-1].After(t) {
			return false
		}
	}
	return true
}

// lateness returns, for every gap between consecutive probes of a plugin
// that overlaps the window [from, to], how much longer than interval it was
// (0 when not longer), and the number of probes of each plugin inside the
// window. Gaps that overlap the window's edges count, so a plugin left
// unprobed at the start or the end of the window is seen too; a plugin not
// probed since before to gets a gap ending at until (when the log was
// read), a lower bound of its real one.
func lateness(probes map[string][]time.Time, ids []string, from, to, until time.Time, interval time.Duration) ([]time.Duration, []int) {
	var late []time.Duration
	var counts []int
	for _, id := range ids {
		ts := probes[id]
		n := 0
		for i, at := range ts {
			if !at.Before(from) && !at.After(to) {
				n++
			}
			if i == 0 || !at.After(from) || !ts[i-1].Before(to) {
				continue
			}
			late = append(late, max(0, at.Sub(ts[i-1])-interval))
		}
		if len(ts) == 0 || ts[len(ts)-1].Before(to) {
			prev := from // never probed at all: count from the window's start
			if len(ts) > 0 {
				prev = ts[len(ts)-1]
			}
			late = append(late, max(0, until.Sub(prev)-interval))
		}
		counts = append(counts, n)
	}
	return late, counts
}

// percentile returns the p-th percentile (nearest rank) of d.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[max(rank, 1)-1]
}

func TestLateness(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, base.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	from, to, until := base.Add(time.Second), base.Add(3*time.Second), base.Add(4*time.Second)
	probes := map[string][]time.Time{
		// On time, early (a ProbeNow) and 30 ms late; the gap across
		// the window's start counts, those wholly outside do not.
		"a": at(0, 500, 900, 1400, 1900, 2430, 2800, 3300, 3800),
		// Not probed after 2000: its open gap ends at until.
		"b": at(1500, 2000),
	}
	late, counts := lateness(probes, []string{"a", "b", "c"}, from, to, until, 500*time.Millisecond)
	ms := time.Millisecond
	want := []time.Duration{0, 0, 30 * ms, 0, 0, 0, 1500 * ms, 2500 * ms}
	if !slices.Equal(late, want) {
		t.Errorf("lateness = %v, want %v", late, want)
	}
	if !slices.Equal(counts, []int{4, 2, 0}) {
		t.Errorf("counts = %v, want [4 2 0]", counts)
	}
	if !probedAfter(probes, []string{"a"}, to) || probedAfter(probes, []string{"a", "b"}, to) {
		t.Error("probedAfter: a was probed after the window, b was not")
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	for p, want := range map[float64]time.Duration{50: 50, 99: 99, 100: 100, 0: 1} {
		if got := percentile(d, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if d[0] != 100 {
		t.Error("percentile sorted its argument in place")
	}
}

func TestReadProbeLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "probes.log")
	// Out of order across plugins and within one, and a torn last line.
	writeFile(t, path, "p0001 3000\np0000 2000\np0000 1000\np0001 12")
	got := readProbeLog(t, path)
	if len(got) != 2 || !slices.Equal(got["p0000"], []time.Time{time.Unix(0, 1000), time.Unix(0, 2000)}) ||
		!slices.Equal(got["p0001"], []time.Time{time.Unix(0, 12), time.Unix(0, 3000)}) {
		t.Errorf("readProbeLog = %v", got)
	}
}
