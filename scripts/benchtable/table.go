package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// figure is one number of a table cell: a figure a benchmark reported, or
// one derived from the figures of the same run.
type figure struct {
	unit  string                          // the figure's unit, when reported
	calc  func(f figures) (float64, bool) // when derived
	scale float64                         // multiplies the value; 0 means 1
	sign  bool                            // a leading + on positive values
	text  string                          // the cell's words, {} for the value
}

// value returns the figure in one run.
func (fg figure) value(f figures) (float64, bool) {
	v, ok := f[fg.unit]
	if fg.calc != nil {
		v, ok = fg.calc(f)
	}
	if fg.scale != 0 {
		v *= fg.scale
	}
	return v, ok
}

// quot is the figure a / b of one run.
func quot(a, b string) func(figures) (float64, bool) {
	return func(f figures) (float64, bool) {
		x, okA := f[a]
		y, okB := f[b]
		return x / y, okA && okB && y != 0
	}
}

// diff is the figure a - b of one run.
func diff(a, b string) func(figures) (float64, bool) {
	return func(f figures) (float64, bool) {
		x, okA := f[a]
		y, okB := f[b]
		return x - y, okA && okB
	}
}

// row is one line of the performance table: what csisupd measured, the
// direct path (or the limit) measured in the same run, their ratio, and
// the target. Every figure of a row comes from one benchmark.
type row struct {
	what   string
	bench  string
	value  []figure
	direct []figure
	ratio  []figure
	target string
}

// ms converts a nanosecond figure to milliseconds.
const ms = 1e-6

// rows are the performance table, in order: the figures of issue 44's
// table first, then the rest of what make bench measures.
var rows = []row{
	{
		what:  "1,000 plugins probed every 5 s, agent without metrics",
		bench: "BenchmarkSteadyState1000",
		value: []figure{{unit: "nometrics_cpu_%core", text: "{} % of a core"}, {unit: "nometrics_rss_MiB", text: "{} MiB"},
			{unit: "nometrics_rss_growth_MiB", text: "{} MiB over the agent with no plugins"}},
		direct: []figure{{unit: "direct_cpu_%core", text: "one grpc-go client per plugin: {} %"},
			{unit: "direct_rss_growth_MiB", text: "RSS growth {} MiB"},
			{unit: "empty_agent_cpu_%core", text: "the agent with no plugins: {} %"}, {unit: "empty_agent_rss_MiB", text: "{} MiB"}},
		ratio: []figure{{calc: quot("nometrics_cpu_%core", "direct_cpu_%core"), text: "{}x CPU"},
			{unit: "nometrics_cpu_growth/direct_cpu", text: "{}x over the agent with no plugins"}},
		target: "<= 0.75x CPU, <= 80 MiB",
	},
	{
		what:   "the same with metrics scraped every 15 s",
		bench:  "BenchmarkSteadyState1000",
		value:  []figure{{unit: "cpu_%core", text: "{} %"}, {unit: "rss_MiB", text: "{} MiB"}},
		ratio:  []figure{{calc: diff("cpu_%core", "nometrics_cpu_%core"), sign: true, text: "{} % of a core"}},
		target: "<= +0.5 % of a core",
	},
	{
		what:  "discovery p99 (socket -> healthy)",
		bench: "BenchmarkNodeAgent",
		value: []figure{{unit: "discovery_p99_ms", text: "{} ms"}},
		direct: []figure{{unit: "probe_direct_p50_ms", text: "probe p50 {} ms"},
			{unit: "direct_discovery_p99_ms", text: "inotify and a bare client's fingerprint: p99 {} ms"}},
		ratio:  []figure{{unit: "discovery_p99/direct_discovery_p99", text: "{}x"}},
		target: "<= 5 ms in three consecutive runs",
	},
	{
		what:   "death detection p99 (plugin killed -> unhealthy)",
		bench:  "BenchmarkNodeAgent",
		value:  []figure{{unit: "death_p99_ms", text: "{} ms"}},
		direct: []figure{{unit: "probe_direct_p50_ms", text: "probe p50 {} ms"}},
		target: "<= 100 ms",
	},
	{
		what:  "ClientCSI p50, 16 callers",
		bench: "BenchmarkClientCSIValidateVolume/vs-direct",
		value: []figure{{unit: "clientcsi-p50-ns", scale: ms, text: "{} ms"}, {unit: "clientcsi-calls/s", text: "{} calls/s"}},
		direct: []figure{{unit: "direct-p50-ns", scale: ms, text: "direct {} ms"},
			{unit: "direct-calls/s", text: "{} calls/s"}, {unit: "relay-p50-x-direct", text: "a bare gRPC relay {}x"}},
		ratio:  []figure{{unit: "p50-x-direct", text: "{}x"}, {unit: "p50-x-relay", text: "{}x the relay"}},
		target: "<= 2.0x",
	},
	{
		what:   "ClientCSI p50 with mutual TLS and ACLs",
		bench:  "BenchmarkClientCSIValidateVolume/vs-direct",
		value:  []figure{{unit: "tls-acl-p50-ns", scale: ms, text: "{} ms"}},
		direct: []figure{{unit: "clientcsi-p50-ns", scale: ms, text: "plain ClientCSI {} ms"}},
		ratio:  []figure{{unit: "tls-acl-p50-x-plain", text: "{}x"}},
		target: "<= 1.3x the plain path",
	},
	{
		what:  "claim p50 (controller publish, stage, publish)",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "claim-p50-ms", text: "{} ms"}},
		direct: []figure{{unit: "direct-claim-p50-ms", text: "the same CSI calls direct: {} ms"},
			{unit: "claim-floor-ms", text: "with its raft writes and fsyncs: {} ms"}},
		ratio:  []figure{{unit: "claim-p50-x-direct", text: "{}x"}, {unit: "claim-p50-x-floor", text: "{}x its floor"}},
		target: "<= 4x",
	},
	{
		what:   "what a claim writes",
		bench:  "BenchmarkClaimRelease",
		value:  []figure{{unit: "raft-writes/claim", text: "{} raft writes"}, {unit: "node-fsyncs/claim", text: "{} fsyncs on the node"}},
		target: "<= 2 raft writes, <= 2 fsyncs",
	},
	{
		what:  "release p50",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "release-p50-ms", text: "{} ms"}},
		direct: []figure{{unit: "direct-release-p50-ms", text: "direct {} ms"},
			{unit: "release-floor-ms", text: "with its raft writes and fsyncs: {} ms"}},
		ratio:  []figure{{unit: "release-p50-x-direct", text: "{}x"}, {unit: "release-p50-x-floor", text: "{}x its floor"}},
		target: "<= 5x",
	},
	{
		what:  "what a release writes",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "raft-writes/release", text: "{} raft writes"}, {unit: "node-fsyncs/release", text: "{} fsyncs on the node"}},
	},
	{
		what:  "a claim's durable writes, same run",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "raft-write-p50-ms", text: "a raft write p50 {} ms"}, {unit: "node-fsync-p50-ms", text: "an fsync on the node p50 {} ms"}},
	},
	{
		what:  "16 concurrent workloads, claim and release, max_destructive_in_flight 1",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "claims/s-16-workloads", text: "{}/s"},
			{unit: "raft-writes/claim+release-16-workloads", text: "{} raft writes each"}},
		direct: []figure{{unit: "serial-claims/s", text: "serial rate from the p50s: {}/s"},
			{unit: "cores-busy-16-workloads", text: "{} cores busy"}},
		ratio:  []figure{{unit: "claims/s-16-workloads-x-serial", text: "{}x"}},
		target: ">= 3x",
	},
	{
		what:  "the same, max_destructive_in_flight 10 (Kubernetes' attacher)",
		bench: "BenchmarkClaimRelease",
		value: []figure{{unit: "claims/s-16-workloads-inflight10", text: "{}/s"},
			{unit: "raft-writes/claim+release-16-workloads-inflight10", text: "{} raft writes each"}},
		direct: []figure{{unit: "serial-claims/s", text: "serial {}/s"},
			{unit: "cores-busy-16-workloads-inflight10", text: "{} cores busy"}},
		ratio:  []figure{{unit: "claims/s-16-workloads-inflight10-x-serial", text: "{}x"}},
		target: ">= 3x",
	},
	{
		what:  "snapshot create p50",
		bench: "BenchmarkSnapshotAndExpand",
		value: []figure{{unit: "snapshot-p50-ms", text: "{} ms"}},
		direct: []figure{{unit: "direct-snapshot-p50-ms", text: "direct {} ms"},
			{unit: "snapshot-floor-ms", text: "with its raft writes: {} ms"}},
		ratio:  []figure{{unit: "snapshot-p50-x-direct", text: "{}x"}, {unit: "snapshot-p50-x-floor", text: "{}x its floor"}},
		target: "<= 5x",
	},
	{
		what:  "expansion p50 (controller and node)",
		bench: "BenchmarkSnapshotAndExpand",
		value: []figure{{unit: "expand-p50-ms", text: "{} ms"}},
		direct: []figure{{unit: "direct-expand-p50-ms", text: "direct {} ms"},
			{unit: "expand-floor-ms", text: "with its raft writes: {} ms"}},
		ratio:  []figure{{unit: "expand-p50-x-direct", text: "{}x"}, {unit: "expand-p50-x-floor", text: "{}x its floor"}},
		target: "<= 5x",
	},
	{
		what:  "leader at 10,000 nodes",
		bench: "BenchmarkCluster10000",
		value: []figure{{unit: "leader_steady_cpu_over_idle_%core", text: "{} % of a core over idle"},
			{unit: "leader_heartbeats/s", text: "{} heartbeats/s"}, {unit: "steady_raft_applies/s", text: "{} raft applies/s"}},
		direct: []figure{{unit: "servers_idle_cpu_%core", text: "idle servers {} %"},
			{unit: "floor_cpu_%core_at_leader_rate", text: "a bare gRPC server taking the same heartbeats: {} %"}},
		ratio: []figure{{unit: "leader_cpu_us/heartbeat", text: "{} µs of leader CPU per heartbeat"},
			{unit: "leader_cpu_x_floor", text: "{}x the bare server's"}},
		target: "<= 10 % of a core over idle, 0 raft applies",
	},
	{
		what:  "10,000 nodes: registration, paging, failover",
		bench: "BenchmarkCluster10000",
		value: []figure{{unit: "registration_s", text: "registered in {} s"}, {unit: "listnodes_page100_p99_ms", text: "ListNodes page p99 {} ms"},
			{unit: "failover_election_max_s", text: "new leader within {} s"}, {unit: "failover_nodes_marked_down", text: "{} nodes marked down"}},
		target: "page p99 < 50 ms, 0 nodes marked down",
	},
	{
		what:   "lease renewals of 10,000 claims on 1,000 nodes, 30 s TTL",
		bench:  "BenchmarkLeaseRenewals1000",
		value:  []figure{{unit: "lease_renewal_cpu_%core", text: "{} % of a core"}, {unit: "claims_renewed/s", text: "{} claims/s"}},
		direct: []figure{{unit: "leader_heartbeats_cpu_over_idle_%core", text: "heartbeats alone: {} % over idle"}},
		ratio:  []figure{{unit: "leader_cpu_us/renewal", text: "{} µs per renewal"}},
		target: "<= 5 % of a core",
	},
	{
		what:   "event latency: one subscriber beside 2,000 stalled",
		bench:  "BenchmarkEventLatencyStalledSubscribers",
		value:  []figure{{unit: "p99_ms", text: "p99 {} ms"}, {unit: "stalled_heap_MiB", text: "{} MiB of heap"}},
		direct: []figure{{unit: "direct_p99_ms", text: "the subscriber alone: p99 {} ms"}},
		ratio:  []figure{{calc: quot("p99_ms", "direct_p99_ms"), text: "{}x"}},
		target: "p99 <= 10 ms, < 64 MiB",
	},
	{
		what:   "plugin updates through 3 servers",
		bench:  "BenchmarkPluginUpdates",
		value:  []figure{{unit: "updates/s", text: "{}/s"}},
		direct: []figure{{unit: "raw-applies/s", text: "raw raft.Apply {}/s"}},
		ratio:  []figure{{unit: "%-of-raw", text: "{} %"}},
		target: ">= 5,000/s, >= 50 % of raw",
	},
	{
		what:  "Consul sync of 1,000 plugin services, first pass",
		bench: "BenchmarkInitialSync1000",
		value: []figure{{unit: "requests/sync", text: "{} requests"}, {unit: "writes/sync", text: "{} writes"}, {unit: "s/sync", text: "{} s"}},
	},
	{
		what:   "Consul sync, steady pass",
		bench:  "BenchmarkSteadyStatePass1000",
		value:  []figure{{unit: "GETs/pass", text: "{} GETs"}, {unit: "writes/pass", text: "{} writes"}},
		target: "2 GETs, 0 writes",
	},
}

// renderTable writes rows as a Markdown table of the figures in res,
// each a range over the benchmark's runs when there are several.
func renderTable(res *results, rows []row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| measure | csisupd | direct path or limit, same run | ratio | target |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|\n")
	for _, r := range rows {
		runs := res.runs[r.bench]
		cells := []string{r.what}
		for _, figs := range [][]figure{r.value, r.direct, r.ratio} {
			cells = append(cells, cell(runs, figs))
		}
		cells = append(cells, r.target)
		fmt.Fprintf(&b, "| %s |\n", strings.Join(cells, " | "))
	}
	return b.String()
}

// runCounts are the fewest and the most runs of the benchmarks of res
// that rows name.
func (res *results) runCounts(rows []row) (least, most int) {
	least = -1
	for _, r := range rows {
		n := len(res.runs[r.bench])
		if least < 0 || n < least {
			least = n
		}
		most = max(most, n)
	}
	return max(least, 0), most
}

// cell renders figs over runs, joined by commas; a figure no run has is
// "-", without its words.
func cell(runs []figures, figs []figure) string {
	var parts []string
	for _, fg := range figs {
		var vals []float64
		for _, f := range runs {
			if v, ok := fg.value(f); ok {
				vals = append(vals, v)
			}
		}
		if len(vals) == 0 {
			parts = append(parts, "-")
			continue
		}
		parts = append(parts, strings.Replace(fg.text, "{}", span(vals, fg.sign), 1))
	}
	return strings.Join(parts, ", ")
}

// span renders the range of vals: one number when they all round to it,
// else "low-high" ("low to high" when one is negative or signed); "-"
// when there is none.
func span(vals []float64, sign bool) string {
	if len(vals) == 0 {
		return "-"
	}
	lo, hi := slices.Min(vals), slices.Max(vals)
	whole := !slices.ContainsFunc(vals, func(v float64) bool { return v != math.Trunc(v) })
	a, z := number(lo, sign, whole), number(hi, sign, whole)
	switch {
	case a == z:
		return a
	case lo < 0, sign:
		return a + " to " + z
	default:
		return a + "-" + z
	}
}

// number renders v with three significant digits (two below 1), or with
// no decimals when whole, and thousands separated by commas.
func number(v float64, sign, whole bool) string {
	digits := 0
	switch a := math.Abs(v); {
	case whole, a >= 100:
	case a >= 10:
		digits = 1
	case a >= 1:
		digits = 2
	default:
		digits = max(2, 1-int(math.Floor(math.Log10(a))))
	}
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if s == "-0" {
		s = "0"
	}
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, _ := strings.Cut(s, ".")
	for i := len(intPart) - 3; i > 0; i -= 3 {
		intPart = intPart[:i] + "," + intPart[i:]
	}
	s = intPart
	if frac != "" {
		s += "." + frac
	}
	switch {
	case neg:
		return "-" + s
	case sign && v > 0:
		return "+" + s
	}
	return s
}
