package plugin

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// WireString returns s as valid UTF-8, which proto3 requires of every
// string field: the marshaller refuses a message with an invalid one, so a
// single plugin directory with a name that is not UTF-8 (Linux file names
// are bytes) would fail Status and ListPlugins and end every event stream
// at its event, again on each reconnect. Each invalid byte becomes the
// text \xNN, so the name stays recognisable; valid strings, the usual
// case, are returned as they are.
func WireString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[i])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
