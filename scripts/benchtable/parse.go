package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// figures are the figures of one run of one benchmark, by unit (the name
// b.ReportMetric gave them, or ns/op).
type figures map[string]float64

// results holds bench output: for each benchmark (its name without the
// GOMAXPROCS suffix), the figures of each of its runs in the order they
// were read. The outputs of several `make bench` runs, one after the
// other, give each benchmark several runs.
type results struct {
	runs  map[string][]figures
	order []string // benchmark names, first seen first
}

// procsSuffix is the -N that go test appends to a benchmark's name when
// GOMAXPROCS is above 1.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// parse reads bench output. A result line is a benchmark's name, its
// iteration count, then value and unit pairs. go test prints the name
// before the benchmark runs and the rest after, so whatever the benchmark
// writes to standard output lands between them: a line of figures without
// a name belongs to the last name that had none.
func parse(r io.Reader) (*results, error) {
	res := &results{runs: make(map[string][]figures)}
	pending := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		name := ""
		if strings.HasPrefix(fields[0], "Benchmark") {
			name, fields = procsSuffix.ReplaceAllString(fields[0], ""), fields[1:]
		}
		figs, ok := parseFigures(fields)
		switch {
		case !ok && name != "":
			pending = name // its figures come later
			continue
		case !ok:
			continue
		case name == "":
			if pending == "" {
				continue
			}
			name = pending
		}
		pending = ""
		if _, seen := res.runs[name]; !seen {
			res.order = append(res.order, name)
		}
		res.runs[name] = append(res.runs[name], figs)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read bench output: %w", err)
	}
	return res, nil
}

// parseFigures reads "N value unit value unit ...", and reports false for
// anything else (a benchmark's own output).
func parseFigures(fields []string) (figures, bool) {
	if len(fields) < 3 || len(fields)%2 == 0 {
		return nil, false
	}
	if _, err := strconv.ParseUint(fields[0], 10, 64); err != nil {
		return nil, false
	}
	figs := make(figures, len(fields)/2)
	for i := 1; i < len(fields); i += 2 {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return nil, false
		}
		figs[fields[i+1]] = v
	}
	return figs, true
}

// merge adds the runs of other after those of res.
func (res *results) merge(other *results) {
	for _, name := range other.order {
		if _, seen := res.runs[name]; !seen {
			res.order = append(res.order, name)
		}
		res.runs[name] = append(res.runs[name], other.runs[name]...)
	}
}
