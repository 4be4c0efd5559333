package deploy

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// step is the scrape interval of the series the alert tests load: sample i
// of a series is at i*step.
const step = time.Minute

// TestAlertsFire evaluates each alert's expression with Prometheus' own
// query engine over series that describe a state, and checks which label
// sets it returns: each alert fires on the state it is named after, for
// the agents or clusters in that state only, and stays quiet otherwise.
// Recording rules are evaluated first, as a Prometheus server would.
// `for` is not evaluated: the series hold the state for the whole test.
//
// Series use the notation of Prometheus' rule unit tests: "0+1x20" is
// 0, 1, ..., 20, one sample every step; the expression is evaluated at the
// last sample (20 steps).
func TestAlertsFire(t *testing.T) {
	groups, problems := checkRules(rulesFile, readmeTable(t))
	if len(problems) > 0 {
		t.Fatalf("the rules file does not load: %q", problems)
	}
	tests := []struct {
		name   string
		alert  string
		series []string
		want   []string // the label sets returned, as labels.Labels prints them
	}{
		{
			name:  "plugin unhealthy",
			alert: "CsisupdPluginUnhealthy",
			series: []string{
				`csisupd_plugin_healthy{job="a", instance="n1", plugin_id="p", type="node", vendor_name="v", vendor_version="1"} 0x20`,
				`csisupd_plugin_healthy{job="a", instance="n2", plugin_id="p", type="node", vendor_name="v", vendor_version="1"} 1x20`,
			},
			want: []string{`{instance="n1", job="a", plugin_id="p", type="node", vendor_name="v", vendor_version="1"}`},
		},
		{
			name:   "plugins healthy",
			alert:  "CsisupdPluginUnhealthy",
			series: []string{`csisupd_plugin_healthy{job="a", instance="n1", plugin_id="p"} 1x20`},
		},
		{
			name:  "probes slow",
			alert: "CsisupdPluginProbeSlow",
			series: []string{
				// n1: every probe between 0.5 s and 2.5 s; n2: all under 0.5 s.
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n1", plugin_id="p", le="0.5"} 0x20`,
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n1", plugin_id="p", le="2.5"} 0+12x20`,
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n1", plugin_id="p", le="+Inf"} 0+12x20`,
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n2", plugin_id="p", le="0.5"} 0+12x20`,
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n2", plugin_id="p", le="2.5"} 0+12x20`,
				`csisupd_plugin_probe_duration_seconds_bucket{job="a", instance="n2", plugin_id="p", le="+Inf"} 0+12x20`,
			},
			want: []string{`{instance="n1", job="a", plugin_id="p"}`},
		},
		{
			name:   "agent not ready",
			alert:  "CsisupdAgentNotReady",
			series: []string{`csisupd_agent_ready{job="a", instance="n1"} 0x20`, `csisupd_agent_ready{job="a", instance="n2"} 1x20`},
			want:   []string{`{instance="n1", job="a"}`},
		},
		{
			name:   "supervisors abandoned",
			alert:  "CsisupdAbandonedSupervisors",
			series: []string{`csisupd_registry_abandoned_supervisors{job="a", instance="n1"} 0x9 1x10`, `csisupd_registry_abandoned_supervisors{job="a", instance="n2"} 0x20`},
			want:   []string{`{instance="n1", job="a"}`},
		},
		{
			name:  "consul requests failing",
			alert: "CsisupdConsulSyncFailing",
			series: []string{
				`csisupd_consul_sync_failures_total{job="a", instance="n1", reason="forbidden"} 0+2x20`,
				`csisupd_consul_sync_failures_total{job="a", instance="n1", reason="timeout"} 0x20`,
				`csisupd_consul_sync_last_success_timestamp_seconds{job="a", instance="n1"} 0+60x20`,
				`csisupd_consul_sync_failures_total{job="a", instance="n2", reason="forbidden"} 0x20`,
				`csisupd_consul_sync_last_success_timestamp_seconds{job="a", instance="n2"} 0+60x20`,
			},
			want: []string{`{instance="n1", job="a"}`},
		},
		{
			name:  "consul sync stuck",
			alert: "CsisupdConsulSyncFailing",
			series: []string{
				// n1 last succeeded at 0 s: 1,200 s ago at the evaluation.
				`csisupd_consul_sync_last_success_timestamp_seconds{job="a", instance="n1"} 0x20`,
				`csisupd_consul_sync_last_success_timestamp_seconds{job="a", instance="n2"} 0+60x20`,
			},
			want: []string{`{instance="n1", job="a"}`},
		},
		{
			name:  "consul sync fine",
			alert: "CsisupdConsulSyncFailing",
			series: []string{
				`csisupd_consul_sync_failures_total{job="a", instance="n1", reason="forbidden"} 3x20`,
				`csisupd_consul_sync_last_success_timestamp_seconds{job="a", instance="n1"} 0+60x20`,
			},
		},
		{
			name:  "watchdog loop late",
			alert: "CsisupdWatchdogNearExpiry",
			series: []string{
				// n1's consul-sync loop went 20 s without a beat 3 steps ago.
				`csisupd_watchdog_loop_beat_age_seconds{job="a", instance="n1", loop="consul-sync"} 2x15 20 2 2 2 2`,
				`csisupd_watchdog_loop_beat_age_seconds{job="a", instance="n1", loop="registry-watcher"} 3x20`,
				`csisupd_watchdog_timeout_seconds{job="a", instance="n1"} 30x20`,
				`csisupd_watchdog_loop_beat_age_seconds{job="a", instance="n2", loop="consul-sync"} 7x20`,
				`csisupd_watchdog_timeout_seconds{job="a", instance="n2"} 30x20`,
			},
			want: []string{`{instance="n1", job="a"}`},
		},
		{
			name:  "watchdog loops beat",
			alert: "CsisupdWatchdogNearExpiry",
			series: []string{
				`csisupd_watchdog_loop_beat_age_seconds{job="a", instance="n1", loop="consul-sync"} 7x20`,
				`csisupd_watchdog_timeout_seconds{job="a", instance="n1"} 30x20`,
			},
		},
		{
			name:  "no leader",
			alert: "CsisupdNoLeader",
			series: []string{
				`csisupd_server_leader{job="a", instance="s1"} 0x20`,
				`csisupd_server_leader{job="a", instance="s2"} 0x20`,
				`csisupd_server_leader{job="b", instance="s4"} 0x20`,
				`csisupd_server_leader{job="b", instance="s5"} 1x20`,
			},
			want: []string{`{job="a"}`},
		},
		{
			name:  "leader moved",
			alert: "CsisupdNoLeader",
			series: []string{
				`csisupd_server_leader{job="a", instance="s1"} 1x9 0x10`,
				`csisupd_server_leader{job="a", instance="s2"} 0x9 1x10`,
			},
		},
		{
			// No server answers the scrape: up == 0 says so, not this alert.
			name:   "no servers scraped",
			alert:  "CsisupdNoLeader",
			series: []string{`csisupd_agent_ready{job="a", instance="n1"} 1x20`},
		},
		{
			name:  "follower cut off",
			alert: "CsisupdRaftFollowerNoContact",
			series: []string{
				`csisupd_server_raft_last_contact_seconds{job="a", instance="s1"} 0x20`,
				`csisupd_server_raft_last_contact_seconds{job="a", instance="s2"} 0+60x20`,
				`csisupd_server_raft_last_contact_seconds{job="a", instance="s3"} 0.05x20`,
			},
			want: []string{`{instance="s2", job="a"}`},
		},
		{
			name:  "apply lagging",
			alert: "CsisupdRaftApplyLag",
			series: []string{
				`csisupd_server_raft_commit_index{job="a", instance="s1"} 0+100x20`,
				`csisupd_server_raft_applied_index{job="a", instance="s1"} 0x20`,
				`csisupd_server_raft_commit_index{job="a", instance="s2"} 0+100x20`,
				`csisupd_server_raft_applied_index{job="a", instance="s2"} 0+100x20`,
			},
			want: []string{`{instance="s1", job="a"}`},
		},
		{
			name:  "node down",
			alert: "CsisupdNodeDown",
			series: []string{
				// Every server reports the replicated state: one alert per cluster.
				`csisupd_cluster_nodes{job="a", instance="s1", status="down"} 1x20`,
				`csisupd_cluster_nodes{job="a", instance="s2", status="down"} 1x20`,
				`csisupd_cluster_nodes{job="a", instance="s1", status="ready"} 4x20`,
				`csisupd_cluster_nodes{job="b", instance="s4", status="down"} 0x20`,
				`csisupd_cluster_nodes{job="b", instance="s4", status="ready"} 5x20`,
			},
			want: []string{`{job="a"}`},
		},
		{
			name:   "nodes ready",
			alert:  "CsisupdNodeDown",
			series: []string{`csisupd_cluster_nodes{job="a", instance="s1", status="down"} 0x20`},
		},
		{
			name:  "release stuck",
			alert: "CsisupdReleaseStuck",
			series: []string{
				// a: one claim unpublishing for the last 15 minutes, seen by both
				// servers; b: one node-unpublished for the last 6 only.
				`csisupd_cluster_claims{job="a", instance="s1", state="unpublishing"} 0x5 1x15`,
				`csisupd_cluster_claims{job="a", instance="s2", state="unpublishing"} 0x5 1x15`,
				`csisupd_cluster_claims{job="a", instance="s1", state="taken"} 3x20`,
				`csisupd_cluster_claims{job="b", instance="s4", state="node-unpublished"} 0x14 1x6`,
				`csisupd_cluster_claims{job="b", instance="s4", state="taken"} 3x20`,
			},
			want: []string{`{job="a"}`},
		},
		{
			// Releases that follow each other, none lasting: one claim in
			// each state for a few minutes, never all ten.
			name:  "releases moving",
			alert: "CsisupdReleaseStuck",
			series: []string{
				`csisupd_cluster_claims{job="a", instance="s1", state="unpublishing"} 0x10 1x3 0x7`,
				`csisupd_cluster_claims{job="a", instance="s1", state="node-unpublished"} 0x13 1x3 0x4`,
				`csisupd_cluster_claims{job="a", instance="s1", state="controller-unpublished"} 0x16 1x2 0x2`,
				`csisupd_cluster_claims{job="a", instance="s1", state="taken"} 5x20`,
			},
		},
		{
			name:  "volumes abnormal",
			alert: "CsisupdVolumesAbnormal",
			series: []string{
				`csisupd_cluster_volumes_abnormal{job="a", instance="s1"} 2x20`,
				`csisupd_cluster_volumes_abnormal{job="a", instance="s2"} 2x20`,
				`csisupd_cluster_volumes_abnormal{job="b", instance="s4"} 0x20`,
			},
			want: []string{`{job="a"}`},
		},
		{
			name:   "volumes normal",
			alert:  "CsisupdVolumesAbnormal",
			series: []string{`csisupd_cluster_volumes_abnormal{job="a", instance="s1"} 0x20`},
		},
		{
			// a: autopilot removed a dead server 10 minutes ago; the two
			// left answer. b: three servers all along. Neither reports its
			// configured count.
			name:  "raft peer removed",
			alert: "CsisupdRaftPeersMissing",
			series: slices.Concat(
				raftSeries("a", raftServer{"s1", "", "3x10 2x10", "1x20"}, raftServer{"s2", "", "3x10 2x10", "0x20"}),
				raftSeries("b", raftServer{"s4", "", "3x20", "1x20"}, raftServer{"s5", "", "3x20", "0x20"},
					raftServer{"s6", "", "3x20", "0x20"}),
			),
			want: []string{`{job="a"}`},
		},
		{
			// s3 stopped answering the scrape 10 minutes ago and is still a
			// voter in the configuration the others report.
			name:  "raft peer down",
			alert: "CsisupdRaftPeersMissing",
			series: raftSeries("a", raftServer{"s1", "", "3x20", "1x20"}, raftServer{"s2", "", "3x20", "0x20"},
				raftServer{"s3", "", "3x10", "0x10"}),
			want: []string{`{job="a"}`},
		},
		{
			// A server grown into the cluster (a nonvoter promoted) is no loss.
			name:  "raft peers all there",
			alert: "CsisupdRaftPeersMissing",
			series: raftSeries("a", raftServer{"s1", "", "2x10 3x10", "1x20"}, raftServer{"s2", "", "2x10 3x10", "0x20"},
				raftServer{"s3", "", "2x10 3x10", "0x20"}),
		},
		{
			// a is configured for 3 servers and has had 2 voters all along
			// (one removed by hand more than a day ago); both answer. b has
			// its 3.
			name:  "raft voters below configured",
			alert: "CsisupdRaftPeersMissing",
			series: slices.Concat(
				raftSeries("a", raftServer{"s1", "3x20", "2x20", "1x20"}, raftServer{"s2", "3x20", "2x20", "0x20"}),
				raftSeries("b", raftServer{"s4", "3x20", "3x20", "1x20"}, raftServer{"s5", "3x20", "3x20", "0x20"},
					raftServer{"s6", "3x20", "3x20", "0x20"}),
			),
			want: []string{`{job="a"}`},
		},
		{
			// a: 3 configured, 3 voters, 3 answering. b: grown past its 3 to
			// 5, all answering. c: a single server.
			name:  "raft peers as configured",
			alert: "CsisupdRaftPeersMissing",
			series: slices.Concat(
				raftSeries("a", raftServer{"s1", "3x20", "3x20", "1x20"}, raftServer{"s2", "3x20", "3x20", "0x20"},
					raftServer{"s3", "3x20", "3x20", "0x20"}),
				raftSeries("b", raftServer{"s4", "3x20", "5x20", "1x20"}, raftServer{"s5", "3x20", "5x20", "0x20"},
					raftServer{"s6", "3x20", "5x20", "0x20"}, raftServer{"s7", "3x20", "5x20", "0x20"},
					raftServer{"s8", "3x20", "5x20", "0x20"}),
				raftSeries("c", raftServer{"s9", "1x20", "1x20", "1x20"}),
			),
		},
		{
			// Each cluster is configured for 3. a: s3 stopped answering 10
			// minutes ago and is still a voter. b: s6 stopped answering and
			// was removed by hand.
			name:  "configured server stops answering",
			alert: "CsisupdRaftPeersMissing",
			series: slices.Concat(
				raftSeries("a", raftServer{"s1", "3x20", "3x20", "1x20"}, raftServer{"s2", "3x20", "3x20", "0x20"},
					raftServer{"s3", "3x10", "3x10", "0x10"}),
				raftSeries("b", raftServer{"s4", "3x20", "3x10 2x10", "1x20"}, raftServer{"s5", "3x20", "3x10 2x10", "0x20"},
					raftServer{"s6", "3x10", "3x10", "0x10"}),
			),
			want: []string{`{job="a"}`, `{job="b"}`},
		},
		{
			// Configured for 3, grown to 5; autopilot removed a dead server
			// 10 minutes ago, leaving 4 voters, all answering.
			name:  "grown cluster shrunk",
			alert: "CsisupdRaftPeersMissing",
			series: raftSeries("a", raftServer{"s1", "3x20", "5x10 4x10", "1x20"}, raftServer{"s2", "3x20", "5x10 4x10", "0x20"},
				raftServer{"s3", "3x20", "5x10 4x10", "0x20"}, raftServer{"s4", "3x20", "5x10 4x10", "0x20"}),
			want: []string{`{job="a"}`},
		},
	}

	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	fired := map[string]bool{}
	for _, tt := range tests {
		if len(tt.want) > 0 {
			fired[tt.alert] = true
		}
	}
	for _, a := range alerts {
		if !fired[a] {
			t.Errorf("alert %s has no case of this test where it fires: add one", a)
		}
	}

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !slices.Contains(alerts, tt.alert) {
				t.Fatalf("no alert %s in %s", tt.alert, rulesFile)
			}
			store, end := loadSeries(t, tt.series)
			store = record(t, engine, groups, store, end)
			for _, g := range groups.Groups {
				for _, r := range g.Rules {
					if r.Alert != tt.alert {
						continue
					}
					got := evalInstant(t, engine, store, r.Expr, end)
					if !slices.Equal(got, tt.want) {
						t.Errorf("%s returns %q, want %q\nexpr: %s", tt.alert, got, tt.want, r.Expr)
					}
				}
			}
		})
	}
}

// raftServer is one server's samples for the CsisupdRaftPeersMissing
// cases, in series notation: its configured count (empty: a server too
// old to report one), the voters of its raft configuration, and whether it
// leads. A server that stops answering has all three end early.
type raftServer struct {
	instance, expect, voters, leader string
}

// raftSeries returns the series the servers of cluster job report.
func raftSeries(job string, servers ...raftServer) []string {
	var out []string
	for _, s := range servers {
		if s.expect != "" {
			out = append(out, fmt.Sprintf(`csisupd_server_bootstrap_expect{job=%q, instance=%q} %s`, job, s.instance, s.expect))
		}
		out = append(out,
			fmt.Sprintf(`csisupd_server_raft_peers{job=%q, instance=%q, suffrage="voter"} %s`, job, s.instance, s.voters),
			fmt.Sprintf(`csisupd_server_leader{job=%q, instance=%q} %s`, job, s.instance, s.leader))
	}
	return out
}

// loadSeries parses series descriptions and returns them as a store, with
// the time of the latest sample.
func loadSeries(t *testing.T, descs []string) (memStore, time.Time) {
	t.Helper()
	p := newParser()
	var (
		store memStore
		last  int64
	)
	for _, d := range descs {
		lset, values, err := p.ParseSeriesDesc(d)
		if err != nil {
			t.Fatalf("series %q: %v", d, err)
		}
		s := memSeries{lset: lset}
		for i, v := range values {
			if v.Omitted {
				continue
			}
			ts := int64(i) * step.Milliseconds()
			s.samples = append(s.samples, floatSample{t: ts, f: v.Value})
			last = max(last, ts)
		}
		store = append(store, s)
	}
	return store, time.UnixMilli(last).UTC()
}

// record evaluates every recording rule over the store's time range, one
// point per step, and returns the store with the rules' outputs added.
func record(t *testing.T, engine *promql.Engine, groups *rulefmt.RuleGroups, store memStore, end time.Time) memStore {
	t.Helper()
	ctx := context.Background()
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			q, err := engine.NewRangeQuery(ctx, store, nil, r.Expr, time.UnixMilli(0), end, step)
			if err != nil {
				t.Fatalf("record %s: %v", r.Record, err)
			}
			res := q.Exec(ctx)
			if res.Err != nil {
				t.Fatalf("record %s: %v", r.Record, res.Err)
			}
			matrix, err := res.Matrix()
			if err != nil {
				t.Fatalf("record %s: %v", r.Record, err)
			}
			var out memStore
			for _, series := range matrix {
				b := labels.NewBuilder(series.Metric).Set(model.MetricNameLabel, r.Record)
				for k, v := range r.Labels {
					b.Set(k, v)
				}
				s := memSeries{lset: b.Labels()}
				for _, pt := range series.Floats {
					s.samples = append(s.samples, floatSample{t: pt.T, f: pt.F})
				}
				out = append(out, s)
			}
			q.Close()
			store = append(store, out...)
		}
	}
	return store
}

// evalInstant evaluates expr at ts and returns the label sets of the
// result without the metric name, sorted: the labels of the alerts a
// Prometheus server would send.
func evalInstant(t *testing.T, engine *promql.Engine, store memStore, expr string, ts time.Time) []string {
	t.Helper()
	ctx := context.Background()
	q, err := engine.NewInstantQuery(ctx, store, nil, expr, ts)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(ctx)
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	vec, err := res.Vector()
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	var got []string
	for _, s := range vec {
		got = append(got, s.Metric.DropReserved(func(n string) bool { return n == model.MetricNameLabel }).String())
	}
	slices.Sort(got)
	return got
}

// memStore is an in-memory storage.Queryable of float series, enough for
// the query engine to evaluate the rules over a test's series.
type memStore []memSeries

// Querier returns the store itself: the engine trims samples to the range.
func (s memStore) Querier(_, _ int64) (storage.Querier, error) { return s, nil }

// Select returns the series all matchers match, sorted by labels.
func (s memStore) Select(_ context.Context, _ bool, _ *storage.SelectHints, matchers ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for _, series := range s {
		if matchAll(series.lset, matchers) {
			out = append(out, series)
		}
	}
	slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	return &seriesSet{series: out, i: -1}
}

// LabelValues is not used by the engine's evaluation.
func (memStore) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

// LabelNames is not used by the engine's evaluation.
func (memStore) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

// Close has nothing to release.
func (memStore) Close() error { return nil }

func matchAll(lset labels.Labels, matchers []*labels.Matcher) bool {
	for _, m := range matchers {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

// memSeries is one series of a memStore.
type memSeries struct {
	lset    labels.Labels
	samples []chunks.Sample
}

func (s memSeries) Labels() labels.Labels { return s.lset }

func (s memSeries) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	return storage.NewListSeries(s.lset, s.samples).Iterator(nil)
}

// seriesSet iterates over selected series.
type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                      { s.i++; return s.i < len(s.series) }
func (s *seriesSet) At() storage.Series              { return s.series[s.i] }
func (*seriesSet) Err() error                        { return nil }
func (*seriesSet) Warnings() annotations.Annotations { return nil }

// floatSample is one float sample at a time in milliseconds.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }
