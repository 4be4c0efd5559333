package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// caFile writes a stand-in CA bundle.
func caFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca-certificates.crt")
	if err := os.WriteFile(path, []byte("-----BEGIN CERTIFICATE-----\nstand-in\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkImage reads the image in out back, from the OCI layout and from the
// docker save tarball: one image, csisupd agent as its entrypoint, the
// labels of the stamp, and the binary and CA bundle in its layer.
func checkImage(t *testing.T, out string, binary []byte) {
	t.Helper()
	index, err := layout.ImageIndexFromPath(filepath.Join(out, imageLayoutDir))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.0" {
		t.Fatalf("layout index = %+v, want one image named 1.2.0", manifest.Manifests)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/csisupd", "agent"}) || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("entrypoint %q on %s/%s, want [/usr/bin/csisupd agent] on linux/amd64", cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.version":  "1.2.0",
		"org.opencontainers.image.revision": "0123456789abcdef0123456789abcdef01234567",
		"org.opencontainers.image.created":  "2026-12-07T11:00:00Z",
		"org.opencontainers.image.source":   imageSource,
	} {
		if got := cf.Config.Labels[key]; got != want {
			t.Errorf("label %s = %q, want %q", key, got, want)
		}
	}
	if got := cf.Created.UTC().Format("2006-01-02T15:04:05Z"); got != "2026-12-07T11:00:00Z" {
		t.Errorf("created %s, want the commit's time", got)
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
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
	if !bytes.Equal(files["usr/bin/csisupd"], binary) || !bytes.Contains(files["etc/ssl/certs/ca-certificates.crt"], []byte("stand-in")) {
		t.Errorf("the layer lacks the binary or the CA bundle: %d files", len(files))
	}

	tag, err := name.NewTag("csisupd:1.2.0")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := tarball.ImageFromPath(filepath.Join(out, imageTarball), &tag)
	if err != nil {
		t.Fatal(err)
	}
	want, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := saved.ConfigName(); err != nil || got != want {
		t.Errorf("the docker save tarball's image config is %v (%v), want the layout's %v", got, err, want)
	}
}

func TestImageTag(t *testing.T) {
	for version, want := range map[string]string{
		"1.2.0":                  "csisupd:1.2.0",
		"0.0.0-dev+0123456789ab": "csisupd:0.0.0-dev-0123456789ab",
	} {
		if got := imageTag(build{Version: version}); got != want {
			t.Errorf("imageTag(%q) = %q, want %q", version, got, want)
		}
		if _, err := name.NewTag(want); err != nil {
			t.Errorf("%s is no valid tag: %v", want, err)
		}
	}
}
