package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeBinary builds a stand-in for the release binary, a small Go
// program that answers `version --json` with stamp and `completion SHELL`
// with a line; being a Go binary, it has the build information the SBOM is
// made from.
func fakeBinary(t *testing.T, stamp string) string {
	t.Helper()
	src := t.TempDir()
	program := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n" +
		"\tswitch {\n" +
		"\tcase len(os.Args) == 3 && os.Args[1] == \"version\" && os.Args[2] == \"--json\":\n\t\tfmt.Println(" + strconv.Quote(stamp) + ")\n" +
		"\tcase len(os.Args) == 3 && os.Args[1] == \"completion\":\n\t\tfmt.Printf(\"# %s completion\\n\", os.Args[2])\n" +
		"\tdefault:\n\t\tos.Exit(2)\n\t}\n}\n"
	for name, data := range map[string]string{"go.mod": "module github.com/csisupd/csisupd\n\ngo 1.26\n", "main.go": program} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "csisupd")
	build := exec.Command("go", "build", "-trimpath", "-o", path, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in binary: %v\n%s", err, out)
	}
	return path
}

const stamp = `{"version": "1.2.0", "commit": "0123456789abcdef0123456789abcdef01234567", "go": "go1.26.8", "dirty": false, "build_time": "2026-12-07T11:00:00Z"}`

// Two runs for one binary write the same bytes, and SHA256SUMS lists the
// binary and both packages.
func TestRunIsReproducible(t *testing.T) {
	bin := fakeBinary(t, stamp)
	deploy := filepath.Join("..", "..", "deploy")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var sums [2][]byte
	for i := range sums {
		out := t.TempDir()
		// The binary beside the packages, as make release leaves it.
		data, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, "csisupd"), data, 0o755); err != nil {
			t.Fatal(err)
		}
		written, err := Run(ctx, Config{Binary: filepath.Join(out, "csisupd"), Deploy: deploy, ManDir: filepath.Join("..", "..", "docs", "man"), Out: out, Arch: "amd64", CAFile: caFile(t)})
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"csisupd_1.2.0-1_amd64.deb", "csisupd-1.2.0-1.x86_64.rpm", "csisupd-image.tar", "oci/index.json", "csisupd.cdx.json", "SHA256SUMS"}
		if strings.Join(written, " ") != strings.Join(want, " ") {
			t.Errorf("wrote %q, want %q", written, want)
		}
		if sums[i], err = os.ReadFile(filepath.Join(out, "SHA256SUMS")); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"csisupd", want[0], want[1], want[2], want[3], want[4]} {
			if !bytes.Contains(sums[i], []byte("  "+name+"\n")) {
				t.Errorf("SHA256SUMS has no line for %s:\n%s", name, sums[i])
			}
		}
		if i == 0 {
			checkDeb(t, filepath.Join(out, want[0]))
			checkImage(t, out, data)
			checkSBOM(t, filepath.Join(out, want[4]))
		}
	}
	if !bytes.Equal(sums[0], sums[1]) {
		t.Errorf("two runs differ:\n%s\n%s", sums[0], sums[1])
	}
}

// checkDeb reads the .deb back with dpkg-deb, where it is installed: the
// files, their modes, the conffiles and the unit's ExecStart.
func checkDeb(t *testing.T, deb string) {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Log("dpkg-deb is not installed: the .deb is not read back")
		return
	}
	list, err := exec.Command("dpkg-deb", "--contents", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --contents: %v", err)
	}
	for _, want := range []string{
		"-rwxr-xr-x root/root .* ./usr/bin/csisupd\n",
		"-rw-r--r-- root/root .* ./lib/systemd/system/csisupd.service\n",
		"-rw-r--r-- root/root .* ./etc/csisupd.d/agent.hcl\n",
		"-rw------- root/root .* ./etc/csisupd.d/csisupd.env\n",
		"drwx------ root/root .* ./var/lib/csisupd/\n",
		"drwxr-x--- root/root .* ./var/lib/csisupd/plugins/\n",
		"-rw-r--r-- root/root .* ./usr/share/doc/csisupd/changelog.Debian.gz\n",
		"-rw-r--r-- root/root .* ./usr/share/doc/csisupd/copyright\n",
		"-rw-r--r-- root/root .* ./usr/share/lintian/overrides/csisupd\n",
		"-rw-r--r-- root/root .* ./usr/share/bash-completion/completions/csisupd\n",
		"-rw-r--r-- root/root .* ./usr/share/man/man1/csisupd-volume-claim.1.gz\n",
		"-rw-r--r-- root/root .* ./usr/share/man/man1/csisupd.1.gz\n",
		"-rw-r--r-- root/root .* ./usr/share/zsh/vendor-completions/_csisupd\n",
		"-rw-r--r-- root/root .* ./usr/share/fish/vendor_completions.d/csisupd.fish\n",
	} {
		if !matchLine(want, string(list)) {
			t.Errorf("the .deb has no line matching %q:\n%s", want, list)
		}
	}
	if strings.Contains(string(list), "/usr/lib/systemd/system") {
		t.Errorf("the .deb holds the rpm's unit path:\n%s", list)
	}
	conffiles, err := exec.Command("dpkg-deb", "--info", deb, "conffiles").Output()
	if err != nil {
		t.Fatalf("dpkg-deb --info conffiles: %v", err)
	}
	if got := string(conffiles); got != "/etc/csisupd.d/agent.hcl\n/etc/csisupd.d/csisupd.env\n" {
		t.Errorf("conffiles = %q, want agent.hcl and csisupd.env", got)
	}
	fsys, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile: %v", err)
	}
	var unit []byte
	tr := tar.NewReader(bytes.NewReader(fsys))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "./lib/systemd/system/csisupd.service" {
			if unit, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Contains(unit, []byte("\nExecStart=/usr/bin/csisupd agent --config /etc/csisupd.d\n")) || bytes.Contains(unit, []byte("/usr/local/bin")) {
		t.Errorf("the packaged unit does not start /usr/bin/csisupd:\n%s", unit)
	}
}

// matchLine reports whether a line of text matches pattern, where ".*"
// stands for any run of characters within the line.
func matchLine(pattern, text string) bool {
	before, after, _ := strings.Cut(pattern, ".*")
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(line, before) && strings.HasSuffix(line, after) {
			return true
		}
	}
	return false
}

func TestRunRefusesAnUnstampedBinary(t *testing.T) {
	bin := fakeBinary(t, `{"version": "0.0.0-dev", "commit": "unknown", "go": "go1.26.8", "dirty": false, "build_time": null}`)
	_, err := Run(context.Background(), Config{Binary: bin, Deploy: filepath.Join("..", "..", "deploy"), ManDir: filepath.Join("..", "..", "docs", "man"), Out: t.TempDir(), Arch: "amd64", CAFile: caFile(t)})
	if err == nil || !strings.Contains(err.Error(), "-bin "+bin+" has no build time") {
		t.Fatalf("Run = %v, want an error naming -bin and the missing build time", err)
	}
}

func TestDebVersion(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.0":                  "1.2.0",
		"1.3.0-rc.1":             "1.3.0~rc.1",
		"0.0.0-dev+0123456789ab": "0.0.0~dev+0123456789ab",
	} {
		if got := debVersion(in); got != want {
			t.Errorf("debVersion(%q) = %q, want %q", in, got, want)
		}
	}
}
