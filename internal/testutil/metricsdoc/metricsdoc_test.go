package metricsdoc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const good = `# Title

Text before the table | with a pipe.

<!-- metrics-table:begin -->
| Name | Type | Labels | Meaning |
|---|---|---|---|
| ` + "`a_total`" + ` | counter | — | things counted |
| ` + "`b_seconds`" + ` | histogram | ` + "`plugin_id`, `reason`" + ` | how long \| how often |
| ` + "`c_info`" + ` | summary |  | a summary |
| ` + "`lib_*`" + ` | gauge, counter | — | a library's families |
<!-- metrics-table:end -->

| Name | Type | Labels | Meaning |
|---|---|---|---|
| ` + "`after`" + ` | gauge | — | not part of the table |
`

func writeReadme(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTable reads a table with every kind of row and checks each field.
func TestTable(t *testing.T) {
	table, err := Table(writeReadme(t, good))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Row{
		"a_total":   {Name: "a_total", Type: "counter", Meaning: "things counted"},
		"b_seconds": {Name: "b_seconds", Type: "histogram", Labels: []string{"plugin_id", "reason"}, Meaning: "how long | how often"},
		"c_info":    {Name: "c_info", Type: "summary", Meaning: "a summary"},
		"lib_*":     {Name: "lib_*", Type: "gauge, counter", Meaning: "a library's families"},
	}
	if len(table) != len(want) {
		t.Errorf("table has %d rows, want %d: %v", len(table), len(want), table)
	}
	for name, w := range want {
		got, ok := table[name]
		if !ok {
			t.Errorf("no row %s", name)
			continue
		}
		if got.Name != w.Name || got.Type != w.Type || got.Meaning != w.Meaning || !slices.Equal(got.Labels, w.Labels) {
			t.Errorf("row %s = %+v, want %+v", name, got, w)
		}
	}
	if !table["lib_*"].Prefix() || table["a_total"].Prefix() {
		t.Error("Prefix is wrong")
	}
}

// TestTableErrors checks that each malformed table is refused with an
// error that says what is wrong.
func TestTableErrors(t *testing.T) {
	row := func(cells string) string {
		return "<!-- metrics-table:begin -->\n| Name | Type | Labels | Meaning |\n|---|---|---|---|\n" + cells + "\n<!-- metrics-table:end -->\n"
	}
	tests := []struct {
		name, text, want string
	}{
		{"no markers", "| Name | Type | Labels | Meaning |\n", "has no line <!-- metrics-table:begin -->"},
		{"no end", "<!-- metrics-table:begin -->\n| Name | Type | Labels | Meaning |\n", "has no line <!-- metrics-table:end -->"},
		{"end first", "<!-- metrics-table:end -->\n", "before"},
		{"two tables", row("| `a` | gauge | — | x |") + row("| `b` | gauge | — | x |"), "second"},
		{"wrong header", "<!-- metrics-table:begin -->\n| Name | Type | Meaning |\n<!-- metrics-table:end -->\n", "header is"},
		{"empty", "<!-- metrics-table:begin -->\n| Name | Type | Labels | Meaning |\n|---|---|---|---|\n<!-- metrics-table:end -->\n", "no rows"},
		{"not a row", row("csisupd_x gauge"), "not a table row"},
		{"three cells", row("| `a` | gauge | x |"), "3 cells"},
		{"bad name", row("| `a-b` | gauge | — | x |"), "not a metric name"},
		{"bad type", row("| `a` | gauges | — | x |"), `type "gauges"`},
		{"bad label", row("| `a` | gauge | `plugin-id` | x |"), "not a label name"},
		{"label twice", row("| `a` | gauge | `x`, `x` | x |"), "listed twice"},
		{"no meaning", row("| `a` | gauge | — |  |"), "no meaning"},
		{"row twice", row("| `a` | gauge | — | x |\n| `a` | counter | — | y |"), "a listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Table(writeReadme(t, tt.text))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Table = %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := Table(filepath.Join(t.TempDir(), "missing.md")); err == nil {
		t.Error("a missing file gave no error")
	}
}

// TestCovers checks exact names, the series of histograms and summaries,
// and prefix rows, and that nothing else is covered.
func TestCovers(t *testing.T) {
	table, err := Table(writeReadme(t, good))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		want bool
	}{
		{"a_total", true},
		{"b_seconds", true},
		{"b_seconds_bucket", true},
		{"b_seconds_sum", true},
		{"b_seconds_count", true},
		{"c_info_sum", true},
		{"c_info_count", true},
		{"c_info_bucket", false}, // a summary has no buckets
		{"a_total_bucket", false},
		{"a_total_count", false},
		{"lib_anything", true},
		{"lib_", true},
		{"lib", false},
		{"a", false},
		{"after", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := Covers(table, tt.name); got != tt.want {
			t.Errorf("Covers(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
