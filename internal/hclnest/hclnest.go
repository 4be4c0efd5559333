// Package hclnest caps how deeply an HCL file nests its blocks, objects,
// lists and parentheses, before the file is parsed.
//
// HCL's parser recurses once per level and builds a node for each: a file
// of 100 KB nested 50,000 deep made it take hundreds of megabytes. Check
// scans the bytes once, allocating nothing, and refuses such a file with
// its line before the parser sees it. The configuration and volume
// specification files nest a few levels; MaxDepth leaves ample room.
//
// The scan skips quoted strings and comments, so that a bracket in either
// does not count. It does not parse: it is a cap, not a syntax check, and
// the parser reports what else is wrong.
package hclnest

import "fmt"

// MaxDepth is the deepest nesting Check accepts.
const MaxDepth = 32

// Check returns an error naming filename and the line where src, HCL
// native syntax, first nests deeper than MaxDepth, or nil.
func Check(filename string, src []byte) error {
	depth, line := 0, 1
	for i := 0; i < len(src); i++ {
		switch c := src[i]; c {
		case '\n':
			line++
		case '{', '[', '(':
			depth++
			if depth > MaxDepth {
				return fmt.Errorf("%s:%d: nested deeper than %d levels of blocks, objects, lists or parentheses: refusing the file before parsing it", filename, line, MaxDepth)
			}
		case '}', ']', ')':
			if depth > 0 {
				depth--
			}
		case '"':
			i, line = skipString(src, i+1, line)
		case '#':
			i = skipLine(src, i)
		case '/':
			if i+1 < len(src) && src[i+1] == '/' {
				i = skipLine(src, i)
			} else if i+1 < len(src) && src[i+1] == '*' {
				i, line = skipBlockComment(src, i+2, line)
			}
		}
	}
	return nil
}

// skipString returns the index of the quote that ends the string starting
// at i, or the last byte, and the line there. A string ends at its line's
// end too: HCL's quoted strings are one line.
func skipString(src []byte, i, line int) (int, int) {
	for ; i < len(src); i++ {
		switch src[i] {
		case '\\':
			i++
		case '"':
			return i, line
		case '\n':
			return i, line + 1
		}
	}
	return len(src) - 1, line
}

// skipLine returns the index of the byte before the newline that ends the
// line holding i, so that the caller's loop counts the newline.
func skipLine(src []byte, i int) int {
	for i+1 < len(src) && src[i+1] != '\n' {
		i++
	}
	return i
}

// skipBlockComment returns the index of the '/' that ends the comment whose
// text starts at i, or the last byte, and the line there.
func skipBlockComment(src []byte, i, line int) (int, int) {
	for ; i < len(src); i++ {
		switch {
		case src[i] == '\n':
			line++
		case src[i] == '*' && i+1 < len(src) && src[i+1] == '/':
			return i + 1, line
		}
	}
	return len(src) - 1, line
}
