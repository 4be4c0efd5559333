package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// display makes s safe to print on a terminal. Plugin ids, descriptions,
// file names in the plugin directory, node names, vendor strings and error
// messages come from plugins, file systems and other nodes; printed raw,
// an escape sequence in one of them would recolour, move or rewrite the
// operator's terminal, and a bidi override would show text in another
// order than it has.
//
// A string of printable runes (letters of any script, marks, numbers,
// punctuation, symbols, the ASCII space) is returned as it is. Any other
// string is returned quoted as strconv.Quote does: control characters
// (C0, DEL, C1), Unicode format characters such as the bidi overrides and
// zero-width characters, line and paragraph separators, other non-ASCII
// spaces and invalid UTF-8 then show as \x1b, \n, \u202e, \xff, and the
// quotes say that the value was escaped. The result is always printable,
// so display(display(s)) == display(s).
//
// JSON output (--json) does not pass through display: it is meant for
// programs, and its encoding escapes the C0 control characters itself.
func display(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// displayLines applies display to each line of a multi-line text, such as
// an error listing several problems, keeping its line breaks.
func displayLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = display(l)
	}
	return strings.Join(lines, "\n")
}

// row writes one line of a tabwriter table, each cell passed through
// display so that no cell carries a tab, a newline or an escape sequence.
func row(w io.Writer, cells ...string) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(w, "\t")
		}
		fmt.Fprint(w, display(c))
	}
	fmt.Fprintln(w)
}
