package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// better tells which way a figure improves.
type better int

const (
	lower   better = iota // latencies, CPU, memory, writes
	higher                // rates
	neither               // the load a benchmark applies, its running time
)

// neutralUnits are figures that describe the load or the machine, not
// what csisupd costs.
var neutralUnits = []string{"ns/op", "heartbeats/s", "leader_heartbeats/s", "renewals/s", "claims_renewed/s", "servers_idle_cpu_%core"}

// machinePrefixes start the names of the direct paths' figures (and of a
// bare gRPC relay's, a bare heartbeat server's and a plain fsync's): the
// same work without csisupd measures the machine, so they are never
// marked; nor are the cores a benchmark kept busy, which is its load.
var machinePrefixes = []string{"direct", "probe_direct", "raw-", "relay-", "node-fsync-p50", "floor_", "cores-busy"}

// direction tells which way unit improves: rates (a "/s" that is not a
// cost, a share of the raw path, a speed-up over the serial path) are
// better higher; everything else, lower.
func direction(unit string) better {
	base, _, _ := strings.Cut(unit, "_ttl") // the lease benchmark's variants
	switch {
	case slices.Contains(neutralUnits, base),
		slices.ContainsFunc(machinePrefixes, func(p string) bool { return strings.HasPrefix(unit, p) }):
		return neither
	case strings.Contains(unit, "applies/s"):
		return lower
	case strings.Contains(unit, "/s"), strings.Contains(unit, "%-of-raw"), strings.HasSuffix(unit, "-x-serial"):
		return higher
	}
	return lower
}

// comparison is one figure of a compare: its median in base's runs and in
// new's, and their spread.
type comparison struct {
	bench, unit string
	base, new   []float64
}

// worse reports whether new is worse than base by more than noise (a
// fraction): by its median, in the figure's direction.
func (c comparison) worse(noise float64) bool {
	if len(c.base) == 0 || len(c.new) == 0 {
		return false
	}
	b, n := median(c.base), median(c.new)
	switch direction(c.unit) {
	case lower:
		if b == 0 {
			return n > 0
		}
		return n > b*(1+noise)
	case higher:
		return n < b*(1-noise)
	}
	return false
}

// compare pairs every figure of base and new, in the order new has them
// (then the figures only base has).
func compare(base, new *results) []comparison {
	var out []comparison
	seen := make(map[[2]string]bool)
	add := func(bench, unit string) {
		key := [2]string{bench, unit}
		if seen[key] {
			return
		}
		seen[key] = true
		out = append(out, comparison{bench: bench, unit: unit, base: values(base, bench, unit), new: values(new, bench, unit)})
	}
	for _, res := range []*results{new, base} {
		for _, bench := range res.order {
			for _, unit := range units(res.runs[bench]) {
				add(bench, unit)
			}
		}
	}
	return out
}

// units are the units of runs, sorted, ns/op last.
func units(runs []figures) []string {
	var out []string
	for _, f := range runs {
		for u := range f {
			if !slices.Contains(out, u) {
				out = append(out, u)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if (a == "ns/op") != (b == "ns/op") {
			if a == "ns/op" {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return out
}

// values are the figure unit of bench in each run of res that has it.
func values(res *results, bench, unit string) []float64 {
	var out []float64
	for _, f := range res.runs[bench] {
		if v, ok := f[unit]; ok {
			out = append(out, v)
		}
	}
	return out
}

func median(vals []float64) float64 {
	s := slices.Sorted(slices.Values(vals))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// writeComparison prints cs as an aligned table: each figure's base and
// new value (the median, with the range when there are several runs), the
// ratio new/base, and "worse" where it is worse by more than noise. It
// returns how many are.
func writeComparison(w io.Writer, cs []comparison, noise float64) (int, error) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tfigure\tbase\tnew\tnew/base\t")
	worse := 0
	for _, c := range cs {
		ratio, flag := "-", ""
		if len(c.base) > 0 && len(c.new) > 0 && median(c.base) != 0 {
			ratio = fmt.Sprintf("%.3f", median(c.new)/median(c.base))
		}
		if c.worse(noise) {
			flag = fmt.Sprintf("worse by more than %g %%", percent(noise))
			worse++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.bench, c.unit, summary(c.base), summary(c.new), ratio, flag)
	}
	if err := tw.Flush(); err != nil {
		return 0, fmt.Errorf("write comparison: %w", err)
	}
	_, err := fmt.Fprintf(w, "%d of %d figures worse by more than %g %% (the noise allowed)\n", worse, len(cs), percent(noise))
	return worse, err
}

// summary renders vals as their median, with their range when they differ;
// "-" when there is none.
func summary(vals []float64) string {
	if len(vals) == 0 {
		return "-"
	}
	med := median(vals)
	m := number(med, false, med == math.Trunc(med))
	if lo, hi := slices.Min(vals), slices.Max(vals); lo != hi {
		m += " (" + span(vals, false) + ")"
	}
	return m
}

// percent shows a fraction as a percentage without the float's rounding
// error (0.14 is 14, not 14.000000000000002), to a hundredth.
func percent(f float64) float64 { return math.Round(f*1e4) / 100 }
