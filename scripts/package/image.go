package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the image is written inside Config.Out: an OCI image layout, and
// the same image as a `docker save` tarball (`podman load -i`).
const (
	imageLayoutDir = "oci"
	imageTarball   = "csisupd-image.tar"
	imageRepo      = "csisupd"
	imageSource    = "https://github.com/csisupd/csisupd"
)

// imageTag is the tag of the image of version b: a tag has no "+", so a
// dev version's commit follows a "-".
func imageTag(b build) string {
	return imageRepo + ":" + strings.ReplaceAll(b.Version, "+", "-")
}

// buildImage is the agent's image, built without a container daemon: one
// layer of the static binary and the CA certificates (caFile, the build
// machine's bundle) on an empty base, every time the commit's.
func buildImage(cfg Config, b build) (v1.Image, error) {
	layer, err := imageLayer(cfg.Binary, cfg.CAFile, b.BuildTime)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: b.BuildTime.UTC()}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: created, CreatedBy: "make package", Comment: "csisupd " + b.Version},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = cfg.Arch
	cf.OS = "linux"
	cf.Created = created
	cf.Config = v1.Config{
		Entrypoint: []string{installedAt, "agent"},
		Env:        []string{"PATH=/usr/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "csisupd",
			"org.opencontainers.image.version":  b.Version,
			"org.opencontainers.image.revision": b.Commit,
			"org.opencontainers.image.created":  b.BuildTime.UTC().Format(time.RFC3339),
			"org.opencontainers.image.source":   imageSource,
		},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// imageLayer is the image's one layer, an uncompressed tar held in memory
// (the opener gives go-containerregistry a fresh reader each time).
func imageLayer(binary, caFile string, mtime time.Time) (v1.Layer, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("image: -ca-file: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []struct {
		name string
		mode int64
		data []byte
	}{
		{"etc/", 0o755, nil}, {"etc/ssl/", 0o755, nil}, {"etc/ssl/certs/", 0o755, nil},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, ca},
		{"tmp/", 0o1777, nil},
		{"usr/", 0o755, nil}, {"usr/bin/", 0o755, nil},
		{strings.TrimPrefix(installedAt, "/"), 0o755, bin},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, ModTime: mtime.UTC(), Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("image layer: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	return layer, nil
}

// writeImage writes img into out as an OCI layout and a `docker save`
// tarball, and returns the names to list in SHA256SUMS.
func writeImage(out string, img v1.Image, b build) ([]string, error) {
	dir := filepath.Join(out, imageLayoutDir)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("image layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("image layout %s: %w", dir, err)
	}
	tag := imageTag(b)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": strings.TrimPrefix(tag, imageRepo+":"),
	})); err != nil {
		return nil, fmt.Errorf("image layout %s: %w", dir, err)
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return nil, fmt.Errorf("image tag %s: %w", tag, err)
	}
	if err := tarball.WriteToFile(filepath.Join(out, imageTarball), ref, img); err != nil {
		return nil, fmt.Errorf("%s: %w", imageTarball, err)
	}
	return []string{imageTarball, filepath.Join(imageLayoutDir, "index.json")}, nil
}
