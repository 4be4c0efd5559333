package ids

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PluginIDPattern is the rule every plugin id follows: the name of its
// socket or socket directory, its key in plugin blocks, and a directory
// name under the mount roots.
const PluginIDPattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`

// pluginIDRE is PluginIDPattern compiled.
var pluginIDRE = regexp.MustCompile(PluginIDPattern)

// ValidPluginID reports whether id follows PluginIDPattern. The same rule
// keeps volume, snapshot and workload ids safe as directory names ("." and
// ".." excepted: see ValidPathID).
func ValidPluginID(id string) bool { return pluginIDRE.MatchString(id) }

// ValidPathID reports whether id follows PluginIDPattern and is neither
// "." nor "..": safe as one directory name. Volume, snapshot and workload
// ids follow it.
func ValidPathID(id string) bool { return id != "." && id != ".." && ValidPluginID(id) }

// MaxNodeName is the longest node name, in bytes.
const MaxNodeName = 253

// CheckNodeName checks the syntax of a node name (the name key, a token's
// node identity, the node a certificate names): 1 to 253 letters, digits,
// '.', '_' and '-', starting with a letter or digit.
func CheckNodeName(s string) error {
	ok := len(s) > 0 && len(s) <= MaxNodeName
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case i > 0 && (r == '.' || r == '_' || r == '-'):
		default:
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%q must start with a letter or digit and contain only letters, digits, '.', '_' and '-' (at most %d)", s, MaxNodeName)
	}
	return nil
}

// NodeID returns the node id made of 16 random bytes: lower-case hex in
// the 8-4-4-4-12 groups of a UUID.
func NodeID(random [16]byte) string {
	b := random[:]
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// CheckText checks a free-form id, name or key that csisupd passes on
// (an external id, a parameter or topology key): valid UTF-8 and no
// control character, so that it prints as one line of text and cannot
// rewrite a terminal or a log. The error quotes s escaped.
func CheckText(s string) error {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			return fmt.Errorf("%q is not valid UTF-8 (at byte %d)", s, i)
		case unicode.IsControl(r):
			return fmt.Errorf("%q contains the control character U+%04X (at byte %d): give printable text", s, r, i)
		}
	}
	return nil
}
