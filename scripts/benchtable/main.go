// Command benchtable reads the output of make bench. Its table subcommand
// writes the performance table of docs/performance.md from it, between
// the markers <!-- bench table --> and <!-- /bench table -->:
//
//	go run ./scripts/benchtable table -doc docs/performance.md bench.out...
//
// Several outputs (or one holding several runs) give each figure as the
// range of its runs. Its compare subcommand pairs every figure of two
// outputs, base and new, and prints each with the ratio new/base, marking
// those worse by more than the noise allowed (make bench-compare):
//
//	go run ./scripts/benchtable compare -noise 10 base.out new.out
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// The markers around the generated table.
const (
	beginMarker = "<!-- bench table -->"
	endMarker   = "<!-- /bench table -->"
)

// errWorse is compare -strict's failure: a figure got worse.
var errWorse = errors.New("figures worse than the noise allowed")

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		if errors.Is(err, errWorse) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: benchtable table|compare [flags] files")
	}
	switch args[0] {
	case "table":
		return runTable(args[1:], stdout)
	case "compare":
		return runCompare(args[1:], stdout)
	}
	return fmt.Errorf("unknown command %q (table or compare)", args[0])
}

func runTable(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("table", flag.ContinueOnError)
	doc := fs.String("doc", "", "the Markdown file whose table to rewrite between its markers (default: print the table)")
	caption := fs.String("caption", "", "words on where and when the runs were made, put under the table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("table: name one or more files of make bench output")
	}
	res, err := readAll(fs.Args())
	if err != nil {
		return err
	}
	least, most := res.runCounts(rows)
	if most == 0 {
		return fmt.Errorf("table: no results of the table's benchmarks in %s", strings.Join(fs.Args(), ", "))
	}
	table := renderTable(res, rows) + "\n" + note(least, most, *caption) + "\n"
	if *doc == "" {
		_, err := io.WriteString(stdout, table)
		return err
	}
	text, err := os.ReadFile(*doc)
	if err != nil {
		return fmt.Errorf("table: %w", err)
	}
	out, err := splice(string(text), table)
	if err != nil {
		return fmt.Errorf("table: %s: %w", *doc, err)
	}
	if err := os.WriteFile(*doc, []byte(out), 0o644); err != nil {
		return fmt.Errorf("table: %w", err)
	}
	return nil
}

// note is the line under the table: how many runs (the fewest, when a
// benchmark has fewer than others: a run of it failed or was left out),
// and the caption.
func note(least, most int, caption string) string {
	s := "From one run of `make bench`"
	switch {
	case most > 1 && least == most:
		s = fmt.Sprintf("From %d runs of `make bench`; each figure is the range of the runs", most)
	case most > 1:
		s = fmt.Sprintf("From %d runs of `make bench` (some benchmarks have %d: \"-\" is none); each figure is the range of the runs", most, least)
	}
	if caption != "" {
		s += " (" + caption + ")"
	}
	return s + ". Written by `make bench-table`."
}

// splice puts table between the markers of doc, in place of what was
// there.
func splice(doc, table string) (string, error) {
	begin := strings.Index(doc, beginMarker)
	end := strings.Index(doc, endMarker)
	if begin < 0 || end < begin {
		return "", fmt.Errorf("no %s ... %s markers", beginMarker, endMarker)
	}
	return doc[:begin+len(beginMarker)] + "\n" + table + doc[end:], nil
}

func runCompare(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	noise := fs.Float64("noise", 10, "how much worse, in percent, a figure may be before it is marked")
	strict := fs.Bool("strict", false, "fail (exit status 3) when a figure is worse by more than the noise")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("compare: name two files of bench output, base and new")
	}
	base, err := readAll(fs.Args()[:1])
	if err != nil {
		return err
	}
	next, err := readAll(fs.Args()[1:])
	if err != nil {
		return err
	}
	worse, err := writeComparison(stdout, compare(base, next), *noise/100)
	if err != nil {
		return err
	}
	if *strict && worse > 0 {
		return fmt.Errorf("compare: %d %w", worse, errWorse)
	}
	return nil
}

// readAll parses files, in order, as one output.
func readAll(files []string) (*results, error) {
	all := &results{runs: make(map[string][]figures)}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("bench output: %w", err)
		}
		res, err := parse(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("bench output %s: %w", name, err)
		}
		all.merge(res)
	}
	return all, nil
}
