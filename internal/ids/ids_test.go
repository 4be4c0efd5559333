package ids

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A plugin id and a path id (volume, snapshot, workload) follow one rule;
// a path id is also neither "." nor "..".
func TestValidPluginAndPathID(t *testing.T) {
	tests := []struct {
		id           string
		plugin, path bool
	}{
		{"a", true, true},
		{"csi-hostpath.example.com", true, true},
		{"A_1.b-2", true, true},
		{"9lives", true, true},
		{"snap.2024-01-01", true, true},
		{"a..b", true, true},
		{strings.Repeat("a", 128), true, true},
		{strings.Repeat("a", 129), false, false},
		{"", false, false},
		{"-a", false, false},
		{"_a", false, false},
		{".a", false, false},
		{".", false, false},
		{"..", false, false},
		{"../x", false, false},
		{"a b", false, false},
		{"a/b", false, false},
		{"a\n", false, false},
		{"plügin", false, false},
	}
	for _, tt := range tests {
		if got := ValidPluginID(tt.id); got != tt.plugin {
			t.Errorf("ValidPluginID(%q) = %v, want %v", tt.id, got, tt.plugin)
		}
		if got := ValidPathID(tt.id); got != tt.path {
			t.Errorf("ValidPathID(%q) = %v, want %v", tt.id, got, tt.path)
		}
	}
}

func TestCheckNodeName(t *testing.T) {
	const rule = ` must start with a letter or digit and contain only letters, digits, '.', '_' and '-' (at most 253)`
	tests := []struct {
		name    string
		wantErr string // "" means valid
	}{
		{"node-1", ""},
		{"n", ""},
		{"web_01.dc1", ""},
		{"9", ""},
		{strings.Repeat("n", 253), ""},
		{strings.Repeat("n", 254), `"` + strings.Repeat("n", 254) + `"` + rule},
		{"", `""` + rule},
		{"-bad name", `"-bad name"` + rule},
		{".n", `".n"` + rule},
		{"_n", `"_n"` + rule},
		{"node/1", `"node/1"` + rule},
		{"nödé", `"nödé"` + rule},
	}
	for _, tt := range tests {
		err := CheckNodeName(tt.name)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("CheckNodeName(%q) = %v, want nil", tt.name, err)
		case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
			t.Errorf("CheckNodeName(%q) = %v, want %s", tt.name, err, tt.wantErr)
		}
	}
}

func TestNodeID(t *testing.T) {
	tests := []struct {
		random [16]byte
		want   string
	}{
		{[16]byte{}, "00000000-0000-0000-0000-000000000000"},
		{[16]byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0xab, 0xff}, "deadbeef-0102-0304-0506-0708090aabff"},
	}
	for _, tt := range tests {
		got := NodeID(tt.random)
		if got != tt.want {
			t.Errorf("NodeID(%x) = %q, want %q", tt.random, got, tt.want)
		}
		// A node id names a server to raft and a node to the servers;
		// it is also a valid node name, so that it may stand for one.
		if err := CheckNodeName(got); err != nil {
			t.Errorf("NodeID(%x) = %q is not a valid node name: %v", tt.random, got, err)
		}
	}
}

// nodeNameRE is CheckNodeName's rule written as a pattern, for the fuzz
// target to compare the loop with.
var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// FuzzIDs feeds arbitrary strings, as plugin directories, registrars,
// configuration files and callers give them, through the id checks. An id
// they accept is one clean path element (or, for a node name, matches the
// rule written as a pattern), and every plugin or path id is also a valid
// node name.
func FuzzIDs(f *testing.F) {
	for _, s := range []string{"a", "csi.example.com", ".", "..", "../x", "-a", "a/b", "plügin", "a\x00b", strings.Repeat("n", 254)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		plugin, path := ValidPluginID(s), ValidPathID(s)
		nodeErr := CheckNodeName(s)
		if path && !plugin {
			t.Fatalf("ValidPathID(%q) but not ValidPluginID", s)
		}
		if path && (filepath.Base(s) != s || filepath.Clean(s) != s || strings.ContainsAny(s, "/\x00")) {
			t.Fatalf("ValidPathID(%q): not one clean path element", s)
		}
		if plugin && (len(s) > 128 || nodeErr != nil) {
			t.Fatalf("ValidPluginID(%q) but %d bytes, node name check %v", s, len(s), nodeErr)
		}
		if want := nodeNameRE.MatchString(s); (nodeErr == nil) != want {
			t.Fatalf("CheckNodeName(%q) = %v, the rule as a pattern says valid = %v", s, nodeErr, want)
		}
	})
}

func TestCheckText(t *testing.T) {
	tests := []struct {
		s    string
		want string // "" for valid
	}{
		{"", ""},
		{"vol-0123456789abcdef", ""},
		{"csi.storage.k8s.io/fstype", ""},
		{"zone with spaces, ünïcode and \uFFFD", ""},
		{"a\nb", `"a\nb" contains the control character U+000A (at byte 1)`},
		{"\x1b[2Jx", `contains the control character U+001B (at byte 0)`},
		{"tab\there", `U+0009 (at byte 3)`},
		{"del\x7f", `U+007F (at byte 3)`},
		{"c1\u0085", `U+0085 (at byte 2)`},
		{"nul\x00", `U+0000 (at byte 3)`},
		{"bad\xffutf8", `"bad\xffutf8" is not valid UTF-8 (at byte 3)`},
	}
	for _, tt := range tests {
		err := CheckText(tt.s)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckText(%q) = %v, want nil", tt.s, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckText(%q) = %v, want an error containing %q", tt.s, err, tt.want)
		}
	}
}
