package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// checkSBOM reads the SBOM of Run's stand-in binary back: csisupd 1.2.0
// of the stamp, and the standard library, its only module.
func checkSBOM(t *testing.T, path string) {
	t.Helper()
	doc := readSBOM(t, path)
	if len(doc.Components) != 1 || doc.Components[0].PURL != "pkg:golang/std@"+strings.TrimPrefix(runtime.Version(), "go") {
		t.Errorf("SBOM components = %+v, want the standard library alone", doc.Components)
	}
}

// The SBOM of the test binary, which links nfpm and go-containerregistry,
// lists them with the standard library.
func TestSBOMOfTheTestBinary(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	b := build{Version: "1.2.0", Commit: "0123456789abcdef0123456789abcdef01234567", BuildTime: time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)}
	name, err := writeSBOM(out, self, b)
	if err != nil {
		t.Fatal(err)
	}
	doc := readSBOM(t, filepath.Join(out, name))
	purls := map[string]bool{}
	for _, c := range doc.Components {
		purls[c.PURL] = true
	}
	for _, want := range []string{
		"pkg:golang/std@" + strings.TrimPrefix(runtime.Version(), "go"),
		"pkg:golang/github.com/goreleaser/nfpm/v2@v2.48.0",
		"pkg:golang/github.com/google/go-containerregistry@v0.22.1",
	} {
		if !purls[want] {
			t.Errorf("SBOM has no component %s", want)
		}
	}
}

// readSBOM reads an SBOM written for the stamp of b above and checks what
// every SBOM holds.
func readSBOM(t *testing.T, path string) cdxBOM {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc cdxBOM
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("SBOM: %v", err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || doc.Version != 1 {
		t.Errorf("SBOM format %s %s version %d, want CycloneDX 1.5 version 1", doc.BOMFormat, doc.SpecVersion, doc.Version)
	}
	m := doc.Metadata
	if m.Timestamp != "2026-12-07T11:00:00Z" || m.Component.Name != "csisupd" || m.Component.Version != "1.2.0" ||
		m.Component.PURL != "pkg:golang/github.com/csisupd/csisupd@v1.2.0" ||
		len(m.Component.Properties) != 1 || m.Component.Properties[0].Value != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("SBOM metadata = %+v, want csisupd 1.2.0 of the stamp", m)
	}
	for _, c := range doc.Components {
		if c.BOMRef != c.PURL || c.Type != "library" {
			t.Errorf("component %+v: want a library whose bom-ref is its purl", c)
		}
	}
	if len(doc.Dependencies) != 1 || len(doc.Dependencies[0].DependsOn) != len(doc.Components) {
		t.Errorf("SBOM dependencies = %+v, want the application depending on each of its %d components", doc.Dependencies, len(doc.Components))
	}
	return doc
}

func TestSBOMRefusesAScript(t *testing.T) {
	script := t.TempDir() + "/csisupd"
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := writeSBOM(t.TempDir(), script, build{Version: "1.2.0"})
	if err == nil || !strings.Contains(err.Error(), "build information of -bin "+script) {
		t.Fatalf("writeSBOM = %v, want an error naming -bin", err)
	}
}

func TestGoPURL(t *testing.T) {
	for _, tt := range []struct{ path, version, want string }{
		{"github.com/goreleaser/nfpm/v2", "v2.48.0", "pkg:golang/github.com/goreleaser/nfpm/v2@v2.48.0"},
		{"github.com/csisupd/csisupd", "v0.0.0-dev+0123456789ab", "pkg:golang/github.com/csisupd/csisupd@v0.0.0-dev%2B0123456789ab"},
	} {
		if got := goPURL(tt.path, tt.version); got != tt.want {
			t.Errorf("goPURL(%q, %q) = %q, want %q", tt.path, tt.version, got, tt.want)
		}
	}
}
