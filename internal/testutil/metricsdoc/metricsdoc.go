// Package metricsdoc reads the table of metrics of docs/operations.md, so that tests can
// hold the code, the alerting rules and the dashboard to what that page
// documents. It is imported by tests only.
//
// The table sits between the lines BeginMarker and EndMarker and has the
// columns | Name | Type | Labels | Meaning |. A name in backticks is one
// metric family; a name ending in "*" (`go_*`) stands for every family
// with that prefix, for collectors the project does not define itself.
// Labels are comma-separated names in backticks, or "—" for none. A "|"
// inside a cell is written "\|", as GitHub's tables want it.
package metricsdoc

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
)

// The markers around the table in docs/operations.md.
const (
	BeginMarker = "<!-- metrics-table:begin -->"
	EndMarker   = "<!-- metrics-table:end -->"
)

// Types a row without "*" may have: Prometheus' metric types.
var types = []string{"counter", "gauge", "histogram", "summary"}

var (
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	header     = []string{"Name", "Type", "Labels", "Meaning"}
)

// Row is one row of the table.
type Row struct {
	// Name is the metric family's name, or a prefix followed by "*".
	Name string
	// Type is counter, gauge, histogram or summary; free text on a
	// prefix row, whose families differ.
	Type string
	// Labels are the family's label names, in the table's order; nil
	// when it has none.
	Labels []string
	// Meaning is what the metric measures.
	Meaning string
}

// Prefix reports whether the row stands for every family starting with
// its name before the "*".
func (r Row) Prefix() bool { return strings.HasSuffix(r.Name, "*") }

// Table reads the metrics table of the Markdown page at readmePath, keyed by
// Row.Name. It fails on a missing marker or header, a row without four
// cells, a malformed or repeated name or label, and an unknown type.
func Table(readmePath string) (map[string]Row, error) {
	f, err := os.Open(readmePath)
	if err != nil {
		return nil, fmt.Errorf("metrics table: %w", err)
	}
	defer f.Close()

	var (
		in, done, sawHeader, sawRule bool
		table                        = map[string]Row{}
		line                         int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		switch {
		case text == BeginMarker:
			if in || done {
				return nil, fmt.Errorf("metrics table: %s:%d: second %s", readmePath, line, BeginMarker)
			}
			in = true
			continue
		case text == EndMarker:
			if !in {
				return nil, fmt.Errorf("metrics table: %s:%d: %s before %s", readmePath, line, EndMarker, BeginMarker)
			}
			in, done = false, true
			continue
		case !in || text == "":
			continue
		}
		cells, ok := splitRow(text)
		if !ok {
			return nil, fmt.Errorf("metrics table: %s:%d: not a table row: %q", readmePath, line, text)
		}
		switch {
		case !sawHeader:
			if !slices.Equal(cells, header) {
				return nil, fmt.Errorf("metrics table: %s:%d: header is %q, want %q", readmePath, line, cells, header)
			}
			sawHeader = true
			continue
		case !sawRule:
			// The |---|---| line under the header.
			sawRule = true
			continue
		}
		row, err := parseRow(cells)
		if err != nil {
			return nil, fmt.Errorf("metrics table: %s:%d: %w", readmePath, line, err)
		}
		if _, dup := table[row.Name]; dup {
			return nil, fmt.Errorf("metrics table: %s:%d: %s listed twice", readmePath, line, row.Name)
		}
		table[row.Name] = row
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics table: read %s: %w", readmePath, err)
	}
	switch {
	case !done && !in:
		return nil, fmt.Errorf("metrics table: %s has no line %s", readmePath, BeginMarker)
	case in:
		return nil, fmt.Errorf("metrics table: %s has no line %s after %s", readmePath, EndMarker, BeginMarker)
	case len(table) == 0:
		return nil, fmt.Errorf("metrics table: %s: the table has no rows", readmePath)
	}
	return table, nil
}

// splitRow returns the trimmed cells of a table line "| a | b |", with
// "\|" read as a "|" inside a cell.
func splitRow(text string) ([]string, bool) {
	if len(text) < 2 || text[0] != '|' || text[len(text)-1] != '|' {
		return nil, false
	}
	text = text[1 : len(text)-1]
	var (
		cells []string
		cell  strings.Builder
	)
	for i := 0; i < len(text); i++ {
		switch {
		case text[i] == '\\' && i+1 < len(text) && text[i+1] == '|':
			cell.WriteByte('|')
			i++
		case text[i] == '|':
			cells = append(cells, strings.TrimSpace(cell.String()))
			cell.Reset()
		default:
			cell.WriteByte(text[i])
		}
	}
	return append(cells, strings.TrimSpace(cell.String())), true
}

// parseRow checks one row's cells and returns the row.
func parseRow(cells []string) (Row, error) {
	if len(cells) != len(header) {
		return Row{}, fmt.Errorf("row has %d cells, want %d: %q", len(cells), len(header), cells)
	}
	row := Row{Name: unquote(cells[0]), Type: cells[1], Meaning: cells[3]}
	if !metricName.MatchString(strings.TrimSuffix(row.Name, "*")) {
		return Row{}, fmt.Errorf("%q is not a metric name (in backticks, a prefix ending in *)", cells[0])
	}
	if !row.Prefix() && !slices.Contains(types, row.Type) {
		return Row{}, fmt.Errorf("%s: type %q is not one of %s", row.Name, row.Type, strings.Join(types, ", "))
	}
	if row.Meaning == "" {
		return Row{}, fmt.Errorf("%s: no meaning", row.Name)
	}
	if l := cells[2]; l != "—" && l != "-" && l != "" {
		for _, name := range strings.Split(l, ",") {
			name = unquote(strings.TrimSpace(name))
			if !labelName.MatchString(name) {
				return Row{}, fmt.Errorf("%s: %q is not a label name", row.Name, name)
			}
			if slices.Contains(row.Labels, name) {
				return Row{}, fmt.Errorf("%s: label %s listed twice", row.Name, name)
			}
			row.Labels = append(row.Labels, name)
		}
	}
	return row, nil
}

// unquote strips the backticks around a code span.
func unquote(s string) string {
	if len(s) >= 2 && s[0] == '`' && s[len(s)-1] == '`' {
		return s[1 : len(s)-1]
	}
	return s
}

// Covers reports whether the table documents the series name: a row of
// that exact name, a histogram row whose family exposes it (_bucket, _sum,
// _count), a summary row likewise (_sum, _count), or a prefix row whose
// prefix it starts with.
func Covers(table map[string]Row, name string) bool {
	if _, ok := table[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if r, ok := table[base]; ok && (r.Type == "histogram" || r.Type == "summary" && suffix != "_bucket") {
			return true
		}
	}
	for _, r := range table {
		if p, ok := strings.CutSuffix(r.Name, "*"); ok && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
