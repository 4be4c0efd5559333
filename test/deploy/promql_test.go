package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/csisupd/csisupd/internal/testutil/metricsdoc"
)

// repoRoot is the repository's root, seen from this package's directory,
// where go test runs the tests.
const repoRoot = "../.."

// readmeTable returns the README's metrics table.
func readmeTable(t *testing.T) map[string]metricsdoc.Row {
	t.Helper()
	table, err := metricsdoc.Table(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// newParser returns a PromQL parser with Prometheus' default functions,
// as a Prometheus server parses rules and Grafana's queries.
func newParser() parser.Parser { return parser.NewParser(parser.Options{}) }

// metricNames returns the metric names that the selectors of expr read,
// sorted and without repeats. A selector whose metric the check cannot
// know (none, or a __name__ regex) is an error: it could read anything.
func metricNames(p parser.Parser, expr string) ([]string, error) {
	e, err := p.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var (
		names []string
		bad   error
	)
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				continue
			}
			if m.Type != labels.MatchEqual {
				bad = fmt.Errorf("%q: selector %s picks metrics by a %s on __name__, which the check cannot verify", expr, vs, m.Type)
				return nil
			}
			name = m.Value
		}
		if name == "" {
			bad = fmt.Errorf("%q: selector %s names no metric", expr, vs)
			return nil
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	slices.Sort(names)
	return names, nil
}

// undocumented returns the metrics expr reads that the table does not
// cover and that are not in also (recording rules' outputs).
func undocumented(p parser.Parser, table map[string]metricsdoc.Row, also map[string]bool, expr string) ([]string, error) {
	names, err := metricNames(p, expr)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, n := range names {
		if !also[n] && !metricsdoc.Covers(table, n) {
			missing = append(missing, n)
		}
	}
	return missing, nil
}

// TestUndocumentedMetricsAreReported proves the check the rules and the
// dashboard go through can fail: a metric the README does not list, a
// series a gauge does not have, and a selector the check cannot read are
// all reported; documented series are not.
func TestUndocumentedMetricsAreReported(t *testing.T) {
	table := readmeTable(t)
	p := newParser()
	tests := []struct {
		expr    string
		also    map[string]bool
		missing []string
		err     bool
	}{
		{expr: `rate(csisupd_not_documented_total[5m])`, missing: []string{"csisupd_not_documented_total"}},
		{expr: `{__name__="csisupd_not_documented"} > 0`, missing: []string{"csisupd_not_documented"}},
		{expr: `csisupd_plugin_healthy == 0 and on (instance) csisupd_agent_nope`, missing: []string{"csisupd_agent_nope"}},
		// csisupd_plugin_healthy is a gauge: it has no buckets.
		{expr: `csisupd_plugin_healthy_bucket`, missing: []string{"csisupd_plugin_healthy_bucket"}},
		{expr: `{__name__=~"csisupd_.+"}`, err: true},
		{expr: `{plugin_id="x"}`, err: true},
		{expr: `rate(csisupd_plugin_probe_failures_total[5m]`, err: true},
		{expr: `histogram_quantile(0.99, sum by (le) (rate(csisupd_plugin_probe_duration_seconds_bucket[5m])))`},
		{expr: `csisupd_raft_commitTime{quantile="0.99"} + go_goroutines + process_resident_memory_bytes`},
		{expr: `rate(grpc_server_handled_total[1m]) + sum(csisupd_my_rule)`, also: map[string]bool{"csisupd_my_rule": true}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			missing, err := undocumented(p, table, tt.also, tt.expr)
			switch {
			case tt.err && err == nil:
				t.Fatalf("no error; want one (missing %q)", missing)
			case !tt.err && err != nil:
				t.Fatal(err)
			}
			if !slices.Equal(missing, tt.missing) {
				t.Errorf("undocumented = %q, want %q", missing, tt.missing)
			}
		})
	}
}
