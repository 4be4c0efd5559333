package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/config/configtest"
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

// validate finds each broken configuration of the config package's tests
// with the problems the loader reports, the same file:line and text, and
// exits 1.
func TestValidateBrokenConfigs(t *testing.T) {
	for _, b := range configtest.Invalid(t, filepath.Join("..", "..", "internal", "config", "testdata", "invalid")) {
		t.Run(b.Name, func(t *testing.T) {
			wantProblems(t, []string{b.Lay(t)}, strings.Split(b.Want, "\n"))
		})
	}
}

// validate reads several paths together and reports the problems of each,
// a missing one among them.
func TestValidateConfigProblems(t *testing.T) {
	writeFiles(t, map[string]string{"a.hcl": `bogus = 1`, "b.hcl": `log_json = 3`})
	wantProblems(t, []string{"a.hcl", "missing.hcl", "b.hcl"}, []string{
		`a.hcl:1: unsupported argument "bogus"`,
		"config: stat missing.hcl: no such file or directory",
		`b.hcl:1: log_json: expected a bool, got number 3`,
	})
}

// wantProblems runs validate on paths and checks that it exits 1 and prints
// the count of the problems, then the problems, one a line, and nothing
// else.
func wantProblems(t *testing.T, paths, want []string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runWith(append([]string{"validate"}, paths...), &stdout, &stderr)
	if code != exitError {
		t.Errorf("exit code %d, want %d", code, exitError)
	}
	count := fmt.Sprintf("Error: %d problems found:", len(want))
	if len(want) == 1 {
		count = "Error: 1 problem found:"
	}
	if got, want := stderr.String(), count+"\n"+strings.Join(want, "\n")+"\n"; got != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", got, want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing", stdout.String())
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
