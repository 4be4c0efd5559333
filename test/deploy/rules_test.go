package deploy

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"

	"github.com/csisupd/csisupd/internal/testutil/metricsdoc"
)

// rulesFile is the Prometheus rules file operators load.
const rulesFile = repoRoot + "/deploy/prometheus/csisupd-alerts.yml"

// checkRules loads the rules file at path as a Prometheus server does
// (unknown fields refused, expressions and templates parsed) and returns
// the groups and what is wrong: load errors, metrics the table does not
// document (recording rules' outputs excepted), alerts without a severity
// or without a summary and a description.
func checkRules(path string, table map[string]metricsdoc.Row) (*rulefmt.RuleGroups, []string) {
	p := newParser()
	severities := []string{"critical", "warning", "info"}
	groups, errs := rulefmt.ParseFile(path, false, model.LegacyValidation, p, slog.New(slog.DiscardHandler))
	var problems []string
	for _, err := range errs {
		problems = append(problems, err.Error())
	}
	if groups == nil {
		return nil, problems
	}
	recorded := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			name := g.Name + "/" + r.Alert + r.Record
			missing, err := undocumented(p, table, recorded, r.Expr)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			}
			for _, m := range missing {
				problems = append(problems, fmt.Sprintf("%s: reads %s, which the README's metrics table does not list", name, m))
			}
			if r.Alert == "" {
				continue
			}
			if !slices.Contains(severities, r.Labels["severity"]) {
				problems = append(problems, fmt.Sprintf("%s: severity label %q is not one of %s", name, r.Labels["severity"], strings.Join(severities, ", ")))
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					problems = append(problems, fmt.Sprintf("%s: no %s annotation", name, a))
				}
			}
		}
	}
	return groups, problems
}

// TestAlertRules loads deploy/prometheus/csisupd-alerts.yml as Prometheus
// would and holds it to the README: every metric a rule reads is in the
// metrics table, every alert has a severity, a summary and a description,
// and the alerts operators rely on are there.
func TestAlertRules(t *testing.T) {
	groups, problems := checkRules(rulesFile, readmeTable(t))
	for _, p := range problems {
		t.Error(p)
	}
	if groups == nil {
		t.FailNow()
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	for _, want := range []string{"CsisupdPluginUnhealthy", "CsisupdNoLeader", "CsisupdNodeDown",
		"CsisupdConsulSyncFailing", "CsisupdWatchdogNearExpiry", "CsisupdReleaseStuck", "CsisupdVolumesAbnormal",
		"CsisupdRaftPeersMissing"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s in %s (alerts: %q)", want, rulesFile, alerts)
		}
	}
}

// TestRulesCheckFails proves checkRules can fail: a rules file with an
// undocumented metric, an alert without severity or annotations and an
// expression that does not parse is reported on each count, while a
// recording rule's output read by an alert is not.
func TestRulesCheckFails(t *testing.T) {
	bad := `groups:
  - name: bad
    rules:
      - record: job:csisupd_plugin_healthy:sum
        expr: sum by (job) (csisupd_plugin_healthy)
      - alert: UsesRecorded
        expr: job:csisupd_plugin_healthy:sum == 0
        labels: {severity: warning}
        annotations: {summary: s, description: d}
      - alert: Undocumented
        expr: csisupd_made_up_total > 0
        labels: {severity: warning}
        annotations: {summary: s, description: d}
      - alert: Unlabelled
        expr: csisupd_agent_ready == 0
`
	path := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, problems := checkRules(path, readmeTable(t))
	all := strings.Join(problems, "\n")
	for _, want := range []string{
		"bad/Undocumented: reads csisupd_made_up_total, which the README's metrics table does not list",
		`bad/Unlabelled: severity label ""`,
		"bad/Unlabelled: no summary annotation",
		"bad/Unlabelled: no description annotation",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not report %q; got:\n%s", want, all)
		}
	}
	if strings.Contains(all, "UsesRecorded") {
		t.Errorf("a recording rule's output was reported:\n%s", all)
	}
	if len(problems) != 4 {
		t.Errorf("got %d problems, want 4:\n%s", len(problems), all)
	}

	unparsable := strings.Replace(bad, "csisupd_made_up_total > 0", "rate(csisupd_agent_ready[5m]", 1)
	if err := os.WriteFile(path, []byte(unparsable), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, problems := checkRules(path, readmeTable(t)); len(problems) == 0 {
		t.Error("an expression that does not parse was not reported")
	}
}
