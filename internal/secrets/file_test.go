package secrets

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// marker is a secret value no error or log may show.
const marker = "s3cr3t-marker-value"

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		want    map[Class]map[string]string // For(class) for each class listed
		wantErr []string                    // substrings of the error
	}{
		{
			name: "default and classes merged over it",
			src: `default {
  token = "` + marker + `"
  user = "admin"
}
controller { user = "ctl" }
node_stage { key = "k" }`,
			want: map[Class]map[string]string{
				Default:     {"token": marker, "user": "admin"},
				Controller:  {"token": marker, "user": "ctl"},
				NodeStage:   {"token": marker, "user": "admin", "key": "k"},
				NodePublish: {"token": marker, "user": "admin"},
				Snapshot:    {"token": marker, "user": "admin"},
			},
		},
		{
			name: "a class without default",
			src:  `snapshot { token = "t" }`,
			want: map[Class]map[string]string{Default: {}, Snapshot: {"token": "t"}, NodeExpand: {}},
		},
		{name: "empty file", src: ``, want: map[Class]map[string]string{Controller: {}}},
		{name: "unknown block", src: `nodestage { a = "b" }`, wantErr: []string{"line 1:1", `unknown block "nodestage"`, "node_stage"}},
		{name: "top-level attribute", src: `token = "` + marker + `"`, wantErr: []string{"line 1:1", `"token"`, "only blocks"}},
		{name: "label", src: `default "x" { a = "b" }`, wantErr: []string{"takes no label"}},
		{name: "twice", src: "default { a = \"b\" }\ndefault { c = \"d\" }", wantErr: []string{"line 2:1", "given twice"}},
		{name: "number", src: "controller {\n  port = 5\n}", wantErr: []string{"line 2:3", "controller.port", "must be a string"}},
		{name: "variable", src: `controller { token = var.x }`, wantErr: []string{"controller.token", "not a constant string"}},
		{name: "nested block", src: "default {\n  inner { a = \"b\" }\n}", wantErr: []string{`not block "inner"`}},
		{name: "syntax", src: `default { token = "` + marker, wantErr: []string{"secrets file f.hcl: line 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse("f.hcl", []byte(tt.src))
			if tt.wantErr != nil {
				if err == nil {
					t.Fatal("Parse succeeded, want an error")
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if strings.Contains(err.Error(), marker) {
					t.Errorf("error %q shows a secret value", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for c, want := range tt.want {
				got := f.For(c)
				if len(got) != len(want) {
					t.Errorf("For(%s) = %d keys, want %v", c, len(got), keysOf(want))
				}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("For(%s)[%s] differs", c, k)
					}
				}
			}
		})
	}
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestLoadChecksWhoMayReadTheFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(`default { token = "`+marker+`" }`), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return path
	}
	if _, err := Load(write("ok.hcl", 0o600)); err != nil {
		t.Errorf("0600: %v", err)
	}
	if _, err := Load(write("ro.hcl", 0o400)); err != nil {
		t.Errorf("0400: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o660, 0o644} {
		path := write("open.hcl", mode)
		_, err := Load(path)
		if err == nil {
			t.Errorf("mode %04o accepted", mode)
			continue
		}
		for _, w := range []string{path, "mode", "chmod 0600 " + path} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("mode %04o: error %q does not name %q", mode, err, w)
			}
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.hcl")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}
	big := filepath.Join(dir, "big.hcl")
	if err := os.WriteFile(big, []byte(strings.Repeat("#", MaxFileSize+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("an oversized file: %v", err)
	}
}

// TestLoadRefusesWhatCouldWedgeOrReplaceIt: a FIFO is refused before
// anything opens it (an open would block for good), and so is a file in a
// directory others may write; a symlink to a good file is read.
func TestLoadRefusesWhatCouldWedgeOrReplaceIt(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.hcl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(fifo); err == nil || !strings.Contains(err.Error(), "secrets file "+fifo+": not a regular file (a FIFO)") {
		t.Errorf("a FIFO: %v", err)
	}
	good := filepath.Join(dir, "good.hcl")
	if err := os.WriteFile(good, []byte(`default { token = "`+marker+`" }`), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.hcl")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if f, err := Load(link); err != nil || f.For(Default)["token"] != marker {
		t.Errorf("a symlink to a good file: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err == nil || !strings.Contains(err.Error(), "directory "+dir+" (mode") || !strings.Contains(err.Error(), "chmod go-w "+dir) {
		t.Errorf("a file in a directory writable by others: %v", err)
	}
	if _, err := Load(link); err == nil || !strings.Contains(err.Error(), "resolves to "+good) {
		t.Errorf("a symlink to a file in a directory writable by others: %v", err)
	}
}

// TestREADMEExampleParses keeps the secrets file of the README's
// runbook a file the agent accepts.
func TestREADMEExampleParses(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	const marker = "# /etc/csisupd.d/secrets/rbd.hcl"
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("docs/operations.md has no example secrets file (%q)", marker)
	}
	_, rest, _ = strings.Cut(rest, "\n") // the rest of the comment line
	example, _, _ := strings.Cut(rest, "```")
	f, err := Parse("docs/operations.md", []byte(example))
	if err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	if got := f.For(NodeStage)["userID"]; got != "admin" {
		t.Errorf("node_stage userID = %q, want admin from default", got)
	}
}
