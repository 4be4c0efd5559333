package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeFiles writes name → content into a new directory, makes it the
// working directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// validate finds the broken configurations of the config package's tests
// with the same file:line and text, and exits 1.
func TestValidateConfigProblems(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		args  []string
		want  []string // the problems, one a line
	}{
		{"bad duration", map[string]string{"agent.hcl": "name = \"n\"\n\n\n\n\nclient {\n  probe_interval = \"5x\"\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:7: client.probe_interval: invalid duration "5x": use a number with a unit, such as "5s" or "1m"`}},
		{"unknown key with suggestion", map[string]string{"agent.hcl": "\nclient {\n  probe_intervall = \"5s\"\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:3: unsupported argument "probe_intervall" in block client; did you mean "probe_interval"?`}},
		{"unknown block", map[string]string{"agent.hcl": "clinet {\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:1: unsupported block "clinet"; did you mean "client"?`}},
		{"duplicate plugin block", map[string]string{"agent.hcl": "plugin \"a\" {\n}\nplugin \"a\" {\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:3: duplicate block plugin "a" (first at line 1): merge them into one`}},
		{"wrong type", map[string]string{"agent.hcl": "ports {\n  rpc = \"abc\"\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:2: ports.rpc: expected a number, got string "abc"`}},
		{"several problems in one file", map[string]string{"agent.hcl": "name = \"n\"\nclient {\n  probe_interval = \"x\"\n}\nbogus = 1\nports {\n  rpc = true\n}"}, []string{"agent.hcl"},
			[]string{
				`agent.hcl:3: client.probe_interval: invalid duration "x": use a number with a unit, such as "5s" or "1m"`,
				`agent.hcl:5: unsupported argument "bogus"`,
				`agent.hcl:7: ports.rpc: expected a number, got bool true`,
			}},
		{"validation: name", map[string]string{"agent.hcl": `name = "-bad name"`}, []string{"agent.hcl"},
			[]string{`agent.hcl:1: name: "-bad name" must start with a letter or digit and contain only letters, digits, '.', '_' and '-' (at most 253)`}},
		{"validation: data_dir", map[string]string{"agent.hcl": `data_dir = "var/lib"`}, []string{"agent.hcl"},
			[]string{`agent.hcl:1: data_dir: "var/lib" must be an absolute path`}},
		{"validation: acl without tls", map[string]string{"agent.hcl": "acl {\n  enabled = true\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:2: acl.enabled: needs TLS (tls.ca_file, tls.cert_file, tls.key_file): servers and agents prove their role by certificate, and tokens must not cross the network in plain text`}},
		{"validation: server duration", map[string]string{"agent.hcl": "server {\n  claim_gc_grace = \"0s\"\n}"}, []string{"agent.hcl"},
			[]string{`agent.hcl:2: server.claim_gc_grace: must be greater than zero, got 0s`}},
		{"several files and a missing one", map[string]string{"a.hcl": `bogus = 1`, "b.hcl": `log_json = 3`}, []string{"a.hcl", "missing.hcl", "b.hcl"},
			[]string{`a.hcl:1: unsupported argument "bogus"`, "config: stat missing.hcl: no such file or directory", `b.hcl:1: log_json: expected a bool, got number 3`}},
		{"nested 50,000 deep", map[string]string{"agent.hcl": "name = \"n\"\nx = " + strings.Repeat("[", 50000) + strings.Repeat("]", 50000)}, []string{"agent.hcl"},
			[]string{`agent.hcl:2: nested deeper than 32 levels of blocks, objects, lists or parentheses: refusing the file before parsing it`}},
		{"a directory", map[string]string{"conf.d/10-base.hcl": "name = \"n\"\n", "conf.d/20-client.hcl": "client {\n  probe_intervall = \"5s\"\n}"}, []string{"conf.d"},
			[]string{`conf.d/20-client.hcl:2: unsupported argument "probe_intervall" in block client; did you mean "probe_interval"?`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			writeFiles(t, tt.files)
			var stdout, stderr bytes.Buffer
			code := runWith(append([]string{"validate"}, tt.args...), &stdout, &stderr)
			if code != exitError {
				t.Errorf("exit code %d, want %d", code, exitError)
			}
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			if len(lines) == 0 || !strings.HasPrefix(lines[0], "Error: ") || !strings.HasSuffix(lines[0], " found:") {
				t.Fatalf("stderr does not start with the count of problems:\n%s", stderr.String())
			}
			if got := lines[1:]; strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// A valid configuration exits 0, says valid and creates nothing.
func TestValidateConfigValid(t *testing.T) {
	dir := writeFiles(t, map[string]string{"conf.d/agent.hcl": "name = \"n\"\ndata_dir = \"/nonexistent/csisupd-validate\"\nclient {\n  plugin_dir = \"/nonexistent/csisupd-validate/plugins\"\n}\n"})
	var stdout, stderr bytes.Buffer
	if code := runWith([]string{"validate", "conf.d"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if want := "configuration valid: conf.d/agent.hcl\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if _, err := os.Stat("/nonexistent/csisupd-validate"); !os.IsNotExist(err) {
		t.Errorf("validate created data_dir: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Errorf("validate wrote into the working directory: %v %v", entries, err)
	}
}

// A directory without *.hcl files is valid, with the agent's warning.
func TestValidateEmptyDirectory(t *testing.T) {
	writeFiles(t, map[string]string{"conf.d/README": "not a config"})
	var stdout, stderr bytes.Buffer
	if code := runWith([]string{"validate", "conf.d"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit code %d, want 0; stderr:\n%s", code, stderr.String())
	}
	if want := "configuration valid: no *.hcl file read, the defaults apply\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if want := "Warning: config directory conf.d has no *.hcl files\n"; stderr.String() != want {
		t.Errorf("stderr = %q, want %q", stderr.String(), want)
	}
}

// --volume-spec checks every file and reports each one's problems with
// file:line, as volume create would.
func TestValidateVolumeSpec(t *testing.T) {
	writeFiles(t, map[string]string{
		"good.hcl":  "id = \"v\"\nplugin_id = \"p\"\ncapacity_min = \"1GiB\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"file-system\"\n}\n",
		"typo.hcl":  "id = \"v\"\nplugin_ids = \"p\"\n",
		"host.hcl":  "id = \"v\"\ntype = \"host\"\n",
		"clone.hcl": "snapshot_id = \"s1\"\nclone_id = \"v0\"\n",
	})
	var stdout, stderr bytes.Buffer
	if code := runWith([]string{"validate", "--volume-spec", "good.hcl"}, &stdout, &stderr); code != exitOK || stdout.String() != "good.hcl: valid\n" {
		t.Fatalf("good.hcl: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	code := runWith([]string{"validate", "--volume-spec", "typo.hcl", "good.hcl", "host.hcl", "clone.hcl", "missing.hcl"}, &stdout, &stderr)
	if code != exitError {
		t.Errorf("exit code %d, want %d", code, exitError)
	}
	want := []string{
		`typo.hcl:2: unsupported argument "plugin_ids"; did you mean "plugin_id"?`,
		`host.hcl:2: type "host": csisupd manages CSI volumes only; type must be "csi"`,
		`clone.hcl:2: snapshot_id and clone_id are exclusive: a volume starts from a snapshot or from another volume, not both`,
	}
	errText := stderr.String()
	if !strings.HasPrefix(errText, "Error: 4 problems found:\n") {
		t.Errorf("stderr does not start with the count:\n%s", errText)
	}
	for _, w := range want {
		if !strings.Contains(errText, "\n"+w+"\n") {
			t.Errorf("stderr lacks %q:\n%s", w, errText)
		}
	}
	if !strings.Contains(errText, "missing.hcl") {
		t.Errorf("stderr does not name missing.hcl:\n%s", errText)
	}
	if stdout.String() != "good.hcl: valid\n" {
		t.Errorf("stdout = %q", stdout.String())
	}
}

// validate without a PATH is a usage error.
func TestValidateNeedsPath(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runWith([]string{"validate"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "  csisupd validate PATH...") {
		t.Errorf("exit %d, stderr:\n%s", code, stderr.String())
	}
}
