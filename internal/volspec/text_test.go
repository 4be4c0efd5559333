package volspec

import (
	"strings"
	"testing"
)

// Control characters in ids, keys and topology values are refused at the
// line of their key; other values may hold anything.
func TestParseRefusesControlCharacters(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // the whole problems; nil for a valid file
	}{
		{"parameter key", "id = \"v\"\nplugin_id = \"p\"\nparameters = {\n  \"a\\nb\" = \"v\"\n}\n",
			[]string{`v.hcl:3: parameters: key "a\nb" contains the control character U+000A (at byte 1): give printable text`}},
		{"secret key", "id = \"v\"\nplugin_id = \"p\"\n\nsecrets = { \"k\\u001b[2J\" = \"s\" }\n",
			[]string{`v.hcl:4: secrets: key "k\x1b[2J" contains the control character U+001B (at byte 1): give printable text`}},
		{"external id and topology key", "id = \"v\"\nexternal_id = \"vol\\u0007\"\ntopology_request {\n  required {\n    topology { segments = { \"zo\\tne\" = \"a\" } }\n  }\n}\n",
			[]string{
				`v.hcl:2: external_id: "vol\a" contains the control character U+0007 (at byte 3): give printable text`,
				`v.hcl:4: topology_request.required: segment key "zo\tne" contains the control character U+0009 (at byte 2): give printable text`,
			}},
		{"topology value", "id = \"v\"\nplugin_id = \"p\"\ntopology_request {\n  preferred {\n    topology { segments = { zone = \"a\\r\" } }\n  }\n}\n",
			[]string{`v.hcl:4: topology_request.preferred: value of segment key "zone": "a\r" contains the control character U+000D (at byte 1): give printable text`}},
		{"values may hold newlines", "id = \"v\"\nplugin_id = \"p\"\nparameters = { cert = \"-----BEGIN\\nabc\\n\" }\nsecrets { key = \"a\\nb\" }\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("v.hcl", []byte(tt.src))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				return
			}
			if err == nil || err.Error() != strings.Join(tt.want, "\n") {
				t.Fatalf("error:\n%v\nwant:\n%s", err, strings.Join(tt.want, "\n"))
			}
		})
	}
}

// A spec built from flags is checked too, when the request is made.
func TestRequestRefusesControlCharacters(t *testing.T) {
	s := &Spec{ID: "v", PluginID: "p", Parameters: map[string]string{"ok": "x", "b\x00d": "y"}}
	_, err := s.CreateRequest()
	if want := `parameters: key "b\x00d" contains the control character U+0000 (at byte 1): give printable text`; err == nil || err.Error() != want {
		t.Fatalf("CreateRequest = %v, want %q", err, want)
	}
	r := &Spec{ID: "v", PluginID: "p", ExternalID: "e\x7f"}
	if _, err := r.Volume(); err == nil || !strings.Contains(err.Error(), `external_id: "e\x7f" contains the control character U+007F`) {
		t.Fatalf("Volume = %v", err)
	}
}

// A file nested far deeper than any specification is refused before HCL
// parses it, at the line where it gets too deep.
func TestParseRefusesDeepNesting(t *testing.T) {
	src := "id = \"v\"\nparameters = " + strings.Repeat("{a = ", 50000) + strings.Repeat("}", 50000) + "\n"
	_, err := Parse("v.hcl", []byte(src))
	if err == nil || !strings.HasPrefix(err.Error(), "v.hcl:2: nested deeper than 32 levels") {
		t.Fatalf("Parse = %v", err)
	}
}
