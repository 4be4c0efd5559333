package volspec

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse, HCL or JSON. It must never panic; each
// problem it reports names the file; a spec it accepts turns into a
// create request or says why not, never with a secret's value; and
// snapshot_id and clone_id never both reach a request.
func FuzzParse(f *testing.F) {
	f.Add([]byte(nomadSpec))
	f.Add([]byte(ExampleCreate))
	f.Add([]byte(uncomment(ExampleRegister)))
	f.Add([]byte("id = \"v\"\nplugin_id = \"p\"\nsecrets = { k = \"s3cr3t\" }\nexternal_id = \"e\"\n"))
	f.Add([]byte("topology_request {\n  required {\n    topology { segments = { a = 1 } }\n  }\n}\n"))
	f.Add([]byte("capability {\n  access_mode = \"x\"\n}\ncapacity_min = 5\n"))
	f.Add([]byte("topology_request { required { topology { segments { \"rack\" = \"R1\", zone = 1 } } } }\nparameters { \"a.b/c\" = <<EOT\nx\nEOT\n}\n"))
	f.Add([]byte("capability { access_mode = \"single-node-writer\", attachment_mode = \"file-system\" }\nmount_options { fs_type = \"ext4\" mount_flags = [\"noatime\"] }\nid = \"v\"\nplugin_id = \"p\"\n"))
	// JSON files, read as JSON because they start with "{".
	f.Add([]byte(`{"id": "v", "plugin_id": "p", "capability": [{"access_mode": "single-node-writer", "attachment_mode": "file-system"}],` +
		` "topology_request": {"required": {"topology": [{"segments": {"rack": "R1"}}]}}, "secrets": {"k": "s3cr3t"}}`))
	f.Add([]byte("{\"id\": \"v\",\n\"mount_options\": {\"fs_type\": null}, \"parameters\": {\"a\": [1, {\"b\": true}]}}\n"))
	at := regexp.MustCompile(`^spec\.hcl(:\d+)?: `)
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > 64<<10 {
			t.Skip("larger than any real specification")
		}
		s, err := Parse("spec.hcl", src)
		if err != nil {
			for _, msg := range strings.Split(err.Error(), "\n") {
				if !at.MatchString(msg) {
					// A joined error may carry a multi-line HCL detail:
					// only the first line of each problem is checked.
					if !continuation(err, msg) {
						t.Errorf("problem does not name spec.hcl: %q", msg)
					}
				}
			}
			return
		}
		req, err := s.CreateRequest()
		secret := ""
		for _, v := range s.Secrets {
			if len(v) >= 4 {
				secret = v
			}
		}
		if err != nil {
			for _, msg := range strings.Split(err.Error(), "\n") {
				if !at.MatchString(msg) && !continuation(err, msg) {
					t.Errorf("problem does not name spec.hcl: %q", msg)
				}
			}
			// A secret's value may also be written elsewhere in the file,
			// as a key or an id: only a value written once counts.
			if secret != "" && strings.Contains(err.Error(), secret) && strings.Count(string(src), secret) == 1 {
				t.Errorf("error %q shows the secret %q", err, secret)
			}
			return
		}
		if req.GetContentSource() != nil && s.SnapshotID != "" && s.CloneID != "" {
			t.Errorf("a request was made with both snapshot_id and clone_id: %v", req)
		}
		if req.GetId() == "" || req.GetPluginId() == "" || len(req.GetCapabilities()) == 0 {
			t.Errorf("a request without id, plugin or capability: %v", req)
		}
	})
}

// continuation reports whether msg is a later line of one of err's
// problems rather than a problem of its own.
func continuation(err error, msg string) bool {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return !strings.HasPrefix(err.Error(), msg)
	}
	for _, e := range joined.Unwrap() {
		text := e.Error()
		if first, _, _ := strings.Cut(text, "\n"); first != msg && strings.Contains(text, msg) {
			return true
		}
	}
	return false
}
