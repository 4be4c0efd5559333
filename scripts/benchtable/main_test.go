package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  map[string][]figures
	}{
		{
			name:  "one line, the GOMAXPROCS suffix dropped",
			input: "BenchmarkA-2   \t      50\t  100 ns/op\t  1.5 x-ms\n",
			want:  map[string][]figures{"BenchmarkA": {{"ns/op": 100, "x-ms": 1.5}}},
		},
		{
			name:  "a sub-benchmark keeps its path",
			input: "BenchmarkA/vs-direct-16   \t 1\t 2 p50-ns\n",
			want:  map[string][]figures{"BenchmarkA/vs-direct": {{"p50-ns": 2}}},
		},
		{
			name:  "the benchmark's own output between its name and its figures",
			input: "BenchmarkA-2 \tbuilding 3 binaries\nstarted\n       1\t 7 ns/op\t 3 y_%core\n",
			want:  map[string][]figures{"BenchmarkA": {{"ns/op": 7, "y_%core": 3}}},
		},
		{
			name: "logs, PASS and package lines are no figures",
			input: "pkg: x\n--- BENCH: BenchmarkA-2\n    a_test.go:9: 12 slow calls\n1 2 three\nPASS\nok  \tx\t1.2s\n" +
				"BenchmarkB-2 \t 1\t 4 z/s\n",
			want: map[string][]figures{"BenchmarkB": {{"z/s": 4}}},
		},
		{
			name:  "figures without any pending name are dropped",
			input: "       1\t 7 ns/op\n",
			want:  map[string][]figures{},
		},
		{
			name:  "a benchmark seen again is its next run",
			input: "BenchmarkA-2 \t 1\t 1 u\nBenchmarkB-2 \t 1\t 5 v\nBenchmarkA-2 \t 1\t 2 u\n",
			want:  map[string][]figures{"BenchmarkA": {{"u": 1}, {"u": 2}}, "BenchmarkB": {{"v": 5}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := parse(strings.NewReader(tt.input))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.runs) != len(tt.want) {
				t.Fatalf("benchmarks = %v, want %v", res.runs, tt.want)
			}
			for name, runs := range tt.want {
				got := res.runs[name]
				if len(got) != len(runs) {
					t.Fatalf("%s runs = %v, want %v", name, got, runs)
				}
				for i := range runs {
					if len(got[i]) != len(runs[i]) {
						t.Errorf("%s run %d = %v, want %v", name, i, got[i], runs[i])
					}
					for u, v := range runs[i] {
						if got[i][u] != v {
							t.Errorf("%s run %d %s = %v, want %v", name, i, u, got[i][u], v)
						}
					}
				}
			}
		})
	}
}

func TestNumber(t *testing.T) {
	tests := []struct {
		v           float64
		sign, whole bool
		want        string
	}{
		{7.764, false, false, "7.76"},
		{22.04, false, false, "22.0"},
		{101.6, false, false, "102"},
		{11677, false, false, "11,677"},
		{1234567, false, true, "1,234,567"},
		{0.0371, false, false, "0.037"},
		{0.9, false, false, "0.90"},
		{2, false, true, "2"},
		{2, false, false, "2.00"},
		{0.15, true, false, "+0.15"},
		{-0.05, true, false, "-0.050"},
		{0, true, true, "0"},
		{-0.0001, false, false, "-0.00010"},
	}
	for _, tt := range tests {
		if got := number(tt.v, tt.sign, tt.whole); got != tt.want {
			t.Errorf("number(%v, %v, %v) = %q, want %q", tt.v, tt.sign, tt.whole, got, tt.want)
		}
	}
}

func TestSpan(t *testing.T) {
	tests := []struct {
		vals []float64
		sign bool
		want string
	}{
		{nil, false, "-"},
		{[]float64{5.23, 5.05}, false, "5.05-5.23"},
		{[]float64{2, 2, 2}, false, "2"},
		{[]float64{2, 2.5}, false, "2.00-2.50"},
		{[]float64{7.761, 7.759}, false, "7.76"},
		{[]float64{-0.02, 0.15}, true, "-0.020 to +0.15"},
		{[]float64{0.051, 0.17}, true, "+0.051 to +0.17"},
	}
	for _, tt := range tests {
		if got := span(tt.vals, tt.sign); got != tt.want {
			t.Errorf("span(%v) = %q, want %q", tt.vals, got, tt.want)
		}
	}
}

// TestRenderTable renders two runs of the sample output and checks rows
// of each kind: reported and derived ratios, ranges, a signed difference,
// a scaled figure missing from the output, and a benchmark without runs.
func TestRenderTable(t *testing.T) {
	res, err := readAll([]string{"testdata/two-runs.out"})
	if err != nil {
		t.Fatal(err)
	}
	table := renderTable(res, rows)
	lines := strings.Split(table, "\n")
	if lines[0] != "| measure | csisupd | direct path or limit, same run | ratio | target |" {
		t.Errorf("header = %q", lines[0])
	}
	tests := []struct {
		measure string
		want    string
	}{
		{"1,000 plugins probed every 5 s, agent without metrics",
			"| 2.07-2.42 % of a core, 101-103 MiB, - | one grpc-go client per plugin: 2.20-2.30 %, RSS growth 70-74 MiB, -, - | 0.90-1.10x CPU, - | <= 0.75x CPU, <= 80 MiB |"},
		{"the same with metrics scraped every 15 s",
			"| 2.22-2.40 %, 104-105 MiB |  | -0.020 to +0.15 % of a core | <= +0.5 % of a core |"},
		{"discovery p99 (socket -> healthy)",
			"| 5.43-7.66 ms | probe p50 0.030-0.040 ms, - | - | <= 5 ms in three consecutive runs |"},
		{"claim p50 (controller publish, stage, publish)",
			"| 7.76-8.12 ms | the same CSI calls direct: 1.54-1.55 ms, - | 5.05-5.23x, - | <= 4x |"},
		{"what a claim writes",
			"| 2 raft writes, 6 fsyncs on the node |  |  | <= 2 raft writes, <= 2 fsyncs |"},
		{"16 concurrent workloads, claim and release, max_destructive_in_flight 1",
			"| 98.0-102/s, 6 raft writes each | serial rate from the p50s: 55.1-56.5/s, - | 1.78-1.80x | >= 3x |"},
		{"the same, max_destructive_in_flight 10 (Kubernetes' attacher)",
			"| 112-120/s, 6 raft writes each | serial 55.1-56.5/s, - | 1.98-2.10x | >= 3x |"},
		{"ClientCSI p50, 16 callers", "| -, - | -, -, - | -, - | <= 2.0x |"},
		{"leader at 10,000 nodes", "| -, -, - | -, - | -, - | <= 10 % of a core over idle, 0 raft applies |"},
	}
	for _, tt := range tests {
		want := "| " + tt.measure + " " + tt.want
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, "| "+tt.measure+" |") {
				found = true
				if l != want {
					t.Errorf("row %q:\n got %s\nwant %s", tt.measure, l, want)
				}
			}
		}
		if !found {
			t.Errorf("no row %q in\n%s", tt.measure, table)
		}
	}
	if got, want := len(lines), len(rows)+3; got != want { // header, rule, rows, trailing newline
		t.Errorf("table has %d lines, want %d", got, want)
	}
}

func TestNote(t *testing.T) {
	tests := []struct {
		least, most int
		caption     string
		want        string
	}{
		{1, 1, "", "From one run of `make bench`. Written by `make bench-table`."},
		{3, 3, "2 cores", "From 3 runs of `make bench`; each figure is the range of the runs (2 cores). Written by `make bench-table`."},
		{2, 3, "", "From 3 runs of `make bench` (some benchmarks have 2: \"-\" is none); each figure is the range of the runs. " +
			"Written by `make bench-table`."},
	}
	for _, tt := range tests {
		if got := note(tt.least, tt.most, tt.caption); got != tt.want {
			t.Errorf("note(%d, %d, %q) = %q, want %q", tt.least, tt.most, tt.caption, got, tt.want)
		}
	}
}

func TestSplice(t *testing.T) {
	tests := []struct {
		name, doc, want, err string
	}{
		{"replaces what was between the markers",
			"# P\n\n<!-- bench table -->\nold\n<!-- /bench table -->\n\nafter\n",
			"# P\n\n<!-- bench table -->\nNEW\n<!-- /bench table -->\n\nafter\n", ""},
		{"empty between them", "<!-- bench table --><!-- /bench table -->", "<!-- bench table -->\nNEW\n<!-- /bench table -->", ""},
		{"no markers", "# P\n", "", "no <!-- bench table -->"},
		{"end before begin", "<!-- /bench table -->\n<!-- bench table -->\n", "", "no <!-- bench table -->"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := splice(tt.doc, "NEW\n")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestTableCommand rewrites a document's table twice: the second run
// leaves it as the first wrote it, and the text around the markers stays.
func TestTableCommand(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "performance.md")
	before := "# Performance\n\n<!-- bench table -->\nby hand\n<!-- /bench table -->\n\nReproduce: make bench.\n"
	if err := os.WriteFile(doc, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"table", "-doc", doc, "-caption", "a 2-core machine", "testdata/two-runs.out"}
	if err := run(args, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Performance\n\n<!-- bench table -->\n| measure |",
		"| claim p50 (controller publish, stage, publish) | 7.76-8.12 ms |",
		"\nFrom 2 runs of `make bench` (some benchmarks have 0: \"-\" is none); each figure is the range of the runs (a 2-core machine). " +
			"Written by `make bench-table`.\n<!-- /bench table -->\n\nReproduce: make bench.\n",
	} {
		if !strings.Contains(string(first), want) {
			t.Errorf("document lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(string(first), "by hand") {
		t.Errorf("the old table is still there:\n%s", first)
	}
	if err := run(args, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first, second) {
		t.Errorf("a second run changed the document:\n%s\nthen\n%s", first, second)
	}
}

func TestDirection(t *testing.T) {
	tests := []struct {
		unit string
		want better
	}{
		{"claim-p50-ms", lower},
		{"raft-writes/claim", lower},
		{"node-fsyncs/claim", lower},
		{"leader_cpu_us/heartbeat", lower},
		{"steady_raft_applies/s", lower},
		{"claims/s-16-workloads", higher},
		{"claims/s-16-workloads-inflight10-x-serial", higher},
		{"updates/s", higher},
		{"raw-applies/s", neither},
		{"direct-claim-p50-ms", neither},
		{"direct_cpu_%core", neither},
		{"probe_direct_p50_ms", neither},
		{"servers_idle_cpu_%core", neither},
		{"floor_cpu_us/heartbeat", neither},
		{"cores-busy-16-workloads", neither},
		{"direct_discovery_p99_ms", neither},
		{"leader_cpu_x_floor", lower},
		{"empty_agent_rss_MiB", lower},
		{"cpu/direct_cpu", lower},
		{"p50-x-direct", lower},
		{"%-of-raw", higher},
		{"clientcsi-calls/s", higher},
		{"heartbeats/s", neither},
		{"renewals/s_ttl10s", neither},
		{"ns/op", neither},
	}
	for _, tt := range tests {
		if got := direction(tt.unit); got != tt.want {
			t.Errorf("direction(%q) = %v, want %v", tt.unit, got, tt.want)
		}
	}
}

// TestCompare compares a base without some figures and benchmarks of new,
// and new without some of base's, with two runs of new.
func TestCompare(t *testing.T) {
	tests := []struct {
		noise  float64
		strict bool
		want   []string // lines, as fields
		err    error
	}{
		{
			noise: 10,
			want: []string{
				"benchmark figure base new new/base",
				"BenchmarkClaimRelease claim-p50-ms 7 7.70 (7.50-7.90) 1.100",
				"BenchmarkClaimRelease claim-p50-x-direct 5 5.70 (5.60-5.80) 1.140 worse by more than 10 %",
				"BenchmarkClaimRelease claims/s-16-workloads 100 87 (85-89) 0.870 worse by more than 10 %",
				"BenchmarkClaimRelease claims/s-16-workloads-inflight10 - 125 (120-130) -",
				"BenchmarkClaimRelease raft-writes/claim 2 2 1.000",
				"BenchmarkClaimRelease ns/op 25,000,000 30,000,000 1.200",
				"BenchmarkPluginUpdates %-of-raw 71 - -",
				"BenchmarkPluginUpdates raw-applies/s 14,000 - -",
				"BenchmarkPluginUpdates updates/s 10,000 - -",
				"BenchmarkPluginUpdates ns/op 98,000 - -",
				"2 of 10 figures worse by more than 10 % (the noise allowed)",
			},
		},
		{
			noise:  15,
			strict: true,
			want: []string{
				"BenchmarkClaimRelease claim-p50-x-direct 5 5.70 (5.60-5.80) 1.140",
				"0 of 10 figures worse by more than 15 % (the noise allowed)",
			},
		},
		{
			// 14/100*100 is 14.000000000000002 in floats.
			noise:  14,
			strict: true,
			want:   []string{"BenchmarkClaimRelease claim-p50-x-direct 5 5.70 (5.60-5.80) 1.140", "0 of 10 figures worse by more than 14 % (the noise allowed)"},
		},
		{
			noise:  12,
			strict: true,
			want:   []string{"BenchmarkClaimRelease claims/s-16-workloads 100 87 (85-89) 0.870 worse by more than 12 %"},
			err:    errWorse,
		},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		args := []string{"compare", "-noise", strconv.FormatFloat(tt.noise, 'g', -1, 64)}
		if tt.strict {
			args = append(args, "-strict")
		}
		args = append(args, "testdata/base.out", "testdata/new.out")
		err := run(args, &out)
		if !errors.Is(err, tt.err) {
			t.Errorf("noise %v: err = %v, want %v", tt.noise, err, tt.err)
		}
		var got []string
		for _, l := range strings.Split(out.String(), "\n") {
			got = append(got, strings.Join(strings.Fields(l), " "))
		}
		for _, w := range tt.want {
			found := false
			for _, g := range got {
				found = found || g == w
			}
			if !found {
				t.Errorf("noise %v: no line %q in\n%s", tt.noise, w, out.String())
			}
		}
	}
}
