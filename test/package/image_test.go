//go:build package

package pkgtest

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/csisupd/csisupd/internal/testutil"
)

// readImage reads make package's OCI layout back: csisupd agent as the
// entrypoint, the revision label HEAD's commit, and the binary in its
// layer the release binary, whose `version` names that commit.
func readImage(t *testing.T, dist string) {
	head, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	commit := strings.TrimSpace(string(head))
	index, err := layout.ImageIndexFromPath(filepath.Join(dist, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil || len(manifest.Manifests) != 1 {
		t.Fatalf("layout index: %v, %v; want one image", manifest, err)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/csisupd", "agent"}) {
		t.Errorf("entrypoint %q, want [/usr/bin/csisupd agent]", cf.Config.Entrypoint)
	}
	if got := cf.Config.Labels["org.opencontainers.image.revision"]; got != commit {
		t.Errorf("revision label %q, want HEAD %s", got, commit)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var binary []byte
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "usr/bin/csisupd" {
			if binary, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	release, err := os.ReadFile(filepath.Join(dist, "csisupd"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(binary, release) {
		t.Fatal("the image's /usr/bin/csisupd is not the release binary")
	}
	var v struct {
		Commit string `json:"commit"`
	}
	out := mustRun(t, filepath.Join(dist, "csisupd"), "version", "--json")
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Commit != commit {
		t.Errorf("version --json of the image's binary = %s (%v), want commit %s", out, err, commit)
	}
}

// podmanStore is a podman with a store of its own (root, run root and
// temporary directory in a test directory, the vfs driver). Its
// containers.conf settings are those Debian's podman needs on the CI
// machines (test/e2e's harness): no default ulimits, cgroupfs and runc.
type podmanStore struct {
	t    *testing.T
	dir  string
	conf string
}

// newPodman returns a podman store of its own, skipping the test where
// podman or runc is not installed.
func newPodman(t *testing.T) *podmanStore {
	t.Helper()
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	p := &podmanStore{t: t, dir: testutil.TempDir(t)}
	p.conf = filepath.Join(p.dir, "containers.conf")
	if err := os.WriteFile(p.conf, []byte("[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = \"cgroupfs\"\nruntime = \"runc\"\nevents_logger = \"file\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// run runs podman with args on the store, with a deadline, and returns its
// combined output.
func (p *podmanStore) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store := []string{"--root", filepath.Join(p.dir, "root"), "--runroot", filepath.Join(p.dir, "runroot"),
		"--tmpdir", filepath.Join(p.dir, "tmp"), "--storage-driver", "vfs", "--events-backend", "file",
		"--cgroup-manager", "cgroupfs", "--runtime", "runc"}
	cmd := exec.CommandContext(ctx, "podman", append(store, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must is run, failing the test on an error.
func (p *podmanStore) must(args ...string) string {
	p.t.Helper()
	out, err := p.run(args...)
	if err != nil {
		p.t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// load loads make package's docker save tarball and returns the image's
// name.
func (p *podmanStore) load(dist string) string {
	p.t.Helper()
	loaded := p.must("load", "-q", "-i", filepath.Join(dist, "csisupd-image.tar"))
	_, image, ok := strings.Cut(strings.TrimSpace(loaded), "Loaded image: ")
	if !ok {
		p.t.Fatalf("podman load printed %q", loaded)
	}
	return image
}

// runImage loads the docker save tarball into a podman store of its own
// and runs the image's binary: `csisupd version` names HEAD's commit.
func runImage(t *testing.T, dist string) {
	p := newPodman(t)
	head, err := exec.Command("git", "-C", repoRoot, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	out := p.must("run", "--rm", "--network=none", "--entrypoint", "/usr/bin/csisupd", p.load(dist), "version")
	if want := "(commit " + strings.TrimSpace(string(head)) + ","; !strings.Contains(out, want) {
		t.Errorf("csisupd version in the image printed %q, want %q", out, want)
	}
}
