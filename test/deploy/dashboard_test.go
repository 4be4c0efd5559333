package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil/metricsdoc"
)

// dashboardFile is the Grafana dashboard operators import.
const dashboardFile = repoRoot + "/deploy/grafana/csisupd-dashboard.json"

// The parts of Grafana's dashboard JSON the check reads.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int       `json:"id"`
	Type       string    `json:"type"`
	Title      string    `json:"title"`
	Datasource *dsRef    `json:"datasource"`
	Targets    []target  `json:"targets"`
	Panels     []panel   `json:"panels"` // a collapsed row's panels
	GridPos    *struct{} `json:"gridPos"`
}

type target struct {
	RefID      string `json:"refId"`
	Expr       string `json:"expr"`
	Datasource *dsRef `json:"datasource"`
}

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *dsRef          `json:"datasource"`
}

// datasourceVar is the dashboard's Prometheus data source variable: every
// query goes through it, so the dashboard works with any Prometheus.
const datasourceVar = "${datasource}"

// grafanaVar matches Grafana's variable syntaxes: $name, ${name},
// ${name:format} and [[name]].
var grafanaVar = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// builtins are Grafana's global variables a query may use, with a value
// that keeps the query valid PromQL.
var builtins = map[string]string{
	"__rate_interval": "5m", "__interval": "1m", "__range": "1h",
	"__interval_ms": "60000", "__range_s": "3600", "__range_ms": "3600000",
}

// expand replaces the Grafana variables in a query with values that keep
// it valid PromQL: durations for the built-in intervals, a regex matching
// anything for the dashboard's own variables (used in =~ matchers). A
// variable the dashboard does not define is an error.
func expand(query string, vars []string) (string, error) {
	var unknown []string
	out := grafanaVar.ReplaceAllStringFunc(query, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := builtins[name]; ok {
			return v
		}
		if slices.Contains(vars, name) {
			return ".+"
		}
		unknown = append(unknown, m)
		return m
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("%q uses %s, which the dashboard does not define", query, strings.Join(unknown, ", "))
	}
	return out, nil
}

// labelValues matches a query variable's label_values(selector, label).
var labelValues = regexp.MustCompile(`^\s*label_values\((.+),\s*(\w+)\s*\)\s*$`)

// checkDashboard decodes a dashboard and returns what is wrong: invalid
// JSON, repeated panel ids, panels or queries not on the data source
// variable, queries that do not parse or read metrics the README's table
// does not document, unknown variables.
func checkDashboard(data []byte, table map[string]metricsdoc.Row) []string {
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		return []string{fmt.Sprintf("not a dashboard: %v", err)}
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if d.Title == "" || d.UID == "" {
		add("dashboard has no title or uid")
	}
	if d.SchemaVersion < 36 {
		add("schemaVersion %d: want 36 or later (data sources referenced by uid)", d.SchemaVersion)
	}

	p := newParser()
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	check := func(where, query string) {
		expr, err := expand(query, vars)
		if err != nil {
			add("%s: %v", where, err)
			return
		}
		missing, err := undocumented(p, table, nil, expr)
		if err != nil {
			add("%s: %v", where, err)
		}
		for _, m := range missing {
			add("%s: reads %s, which the README's metrics table does not list", where, m)
		}
	}

	sawDatasource := false
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			var q string
			if v.Name == "datasource" && json.Unmarshal(v.Query, &q) == nil && q == "prometheus" {
				sawDatasource = true
			}
		case "query":
			// The query is a string or, in current Grafana, {"query": "..."}.
			var q string
			if json.Unmarshal(v.Query, &q) != nil {
				var obj struct {
					Query string `json:"query"`
				}
				if err := json.Unmarshal(v.Query, &obj); err != nil {
					add("variable %s: query %s: %v", v.Name, v.Query, err)
					continue
				}
				q = obj.Query
			}
			if v.Datasource == nil || v.Datasource.UID != datasourceVar {
				add("variable %s: data source is not %s", v.Name, datasourceVar)
			}
			m := labelValues.FindStringSubmatch(q)
			if m == nil {
				add("variable %s: query %q is not label_values(selector, label)", v.Name, q)
				continue
			}
			check("variable "+v.Name, m[1])
		}
	}
	if !sawDatasource {
		add(`no variable "datasource" of type datasource for prometheus`)
	}
	if !slices.Contains(vars, "instance") {
		add(`no variable "instance"`)
	}

	ids := map[int]string{}
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, pn := range panels {
			where := fmt.Sprintf("panel %d %q", pn.ID, pn.Title)
			if prev, dup := ids[pn.ID]; dup {
				add("%s: id %d is also panel %q's", where, pn.ID, prev)
			}
			ids[pn.ID] = pn.Title
			if pn.GridPos == nil {
				add("%s: no gridPos", where)
			}
			if pn.Type == "row" {
				walk(pn.Panels)
				continue
			}
			if pn.Datasource == nil || pn.Datasource.UID != datasourceVar {
				add("%s: data source is not %s", where, datasourceVar)
			}
			if len(pn.Targets) == 0 {
				add("%s: no queries", where)
			}
			var refs []string
			for _, tg := range pn.Targets {
				if slices.Contains(refs, tg.RefID) {
					add("%s: refId %q twice", where, tg.RefID)
				}
				refs = append(refs, tg.RefID)
				if tg.Datasource != nil && tg.Datasource.UID != datasourceVar {
					add("%s: query %s: data source is not %s", where, tg.RefID, datasourceVar)
				}
				if strings.TrimSpace(tg.Expr) == "" {
					add("%s: query %s has no expr", where, tg.RefID)
					continue
				}
				check(where+" query "+tg.RefID, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	return problems
}

// TestDashboard holds deploy/grafana/csisupd-dashboard.json to the README:
// it is valid JSON with unique panel ids, every panel reads the data
// source variable, and every query parses as PromQL (Grafana's variables
// substituted) and reads only metrics of the metrics table.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkDashboard(data, readmeTable(t)) {
		t.Error(p)
	}
}

// TestDashboardCheckFails proves checkDashboard can fail: each fault
// written into a copy of the real dashboard is reported.
func TestDashboardCheckFails(t *testing.T) {
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	table := readmeTable(t)
	tests := []struct {
		name  string
		fault func(d map[string]any)
		want  string
	}{
		{
			name:  "undocumented metric",
			fault: func(d map[string]any) { firstTarget(t, d)["expr"] = `rate(csisupd_made_up_total[$__rate_interval])` },
			want:  "reads csisupd_made_up_total, which the README's metrics table does not list",
		},
		{
			name:  "unknown variable",
			fault: func(d map[string]any) { firstTarget(t, d)["expr"] = `csisupd_agent_ready{node=~"$node"}` },
			want:  "uses $node, which the dashboard does not define",
		},
		{
			name:  "not PromQL",
			fault: func(d map[string]any) { firstTarget(t, d)["expr"] = `sum(csisupd_agent_ready` },
			want:  "parse",
		},
		{
			name: "repeated panel id",
			fault: func(d map[string]any) {
				panels := d["panels"].([]any)
				panels[2].(map[string]any)["id"] = panels[1].(map[string]any)["id"]
			},
			want: "is also panel",
		},
		{
			name: "fixed data source",
			fault: func(d map[string]any) {
				firstPanel(t, d)["datasource"] = map[string]any{"type": "prometheus", "uid": "abc"}
			},
			want: "data source is not ${datasource}",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d map[string]any
			if err := json.Unmarshal(data, &d); err != nil {
				t.Fatal(err)
			}
			tt.fault(d)
			faulty, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			problems := checkDashboard(faulty, table)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("no problem mentions %q; got %q", tt.want, problems)
			}
		})
	}
	if problems := checkDashboard([]byte(`{"panels": [`), table); len(problems) == 0 {
		t.Error("invalid JSON was not reported")
	}
}

// firstPanel returns the dashboard's first panel that has queries.
func firstPanel(t *testing.T, d map[string]any) map[string]any {
	t.Helper()
	for _, p := range d["panels"].([]any) {
		if pm := p.(map[string]any); pm["targets"] != nil {
			return pm
		}
	}
	t.Fatal("the dashboard has no panel with queries")
	return nil
}

// firstTarget returns the first query of firstPanel.
func firstTarget(t *testing.T, d map[string]any) map[string]any {
	t.Helper()
	return firstPanel(t, d)["targets"].([]any)[0].(map[string]any)
}
