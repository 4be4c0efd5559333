package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// sbomFile is the SBOM's name inside Config.Out.
const sbomFile = "csisupd.cdx.json"

// The CycloneDX 1.5 JSON document (https://cyclonedx.org/docs/1.5/json/),
// the fields this SBOM fills.
type (
	cdxBOM struct {
		BOMFormat    string          `json:"bomFormat"`
		SpecVersion  string          `json:"specVersion"`
		Version      int             `json:"version"`
		Metadata     cdxMetadata     `json:"metadata"`
		Components   []cdxComponent  `json:"components"`
		Dependencies []cdxDependency `json:"dependencies"`
	}
	cdxMetadata struct {
		Timestamp string       `json:"timestamp"`
		Component cdxComponent `json:"component"`
	}
	cdxComponent struct {
		Type        string        `json:"type"`
		BOMRef      string        `json:"bom-ref"`
		Name        string        `json:"name"`
		Version     string        `json:"version,omitempty"`
		PURL        string        `json:"purl,omitempty"`
		Description string        `json:"description,omitempty"`
		Properties  []cdxProperty `json:"properties,omitempty"`
	}
	cdxProperty struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	}
	cdxDependency struct {
		Ref       string   `json:"ref"`
		DependsOn []string `json:"dependsOn"`
	}
)

// goPURL is the package URL of a Go module version
// (https://github.com/package-url/purl-spec, type golang); a "+" of the
// version is percent-encoded, as the spec wants.
func goPURL(path, version string) string {
	return "pkg:golang/" + path + "@" + strings.ReplaceAll(version, "+", "%2B")
}

// writeSBOM writes the CycloneDX SBOM of the Go modules linked into binary,
// as the go command recorded them in it, and returns its name. The Go
// standard library is a component too, at the toolchain's version.
func writeSBOM(out, binary string, b build) (string, error) {
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		return "", fmt.Errorf("SBOM: build information of -bin %s: %w", binary, err)
	}
	mainRef := goPURL(bi.Main.Path, "v"+b.Version)
	doc := cdxBOM{
		BOMFormat:   "CycloneDX",
		SpecVersion: "1.5",
		Version:     1,
		Metadata: cdxMetadata{
			Timestamp: b.BuildTime.UTC().Format(time.RFC3339),
			Component: cdxComponent{
				Type: "application", BOMRef: mainRef, Name: "csisupd", Version: b.Version, PURL: mainRef,
				Description: "CSI plugin supervisor",
				Properties:  []cdxProperty{{Name: "vcs.revision", Value: b.Commit}},
			},
		},
	}
	std := cdxComponent{
		Type: "library", Name: "std", Version: bi.GoVersion,
		PURL: goPURL("std", strings.TrimPrefix(bi.GoVersion, "go")),
	}
	std.BOMRef = std.PURL
	doc.Components = append(doc.Components, std)
	deps := []string{std.BOMRef}
	for _, m := range bi.Deps {
		c := cdxComponent{Type: "library", Name: m.Path, Version: m.Version, PURL: goPURL(m.Path, m.Version)}
		if m.Replace != nil {
			// The code linked is the replacement's.
			c.Properties = []cdxProperty{{Name: "go.replaced-by", Value: m.Replace.Path + "@" + m.Replace.Version}}
			if m.Replace.Version != "" {
				c.Version, c.PURL = m.Replace.Version, goPURL(m.Replace.Path, m.Replace.Version)
			}
		}
		if m.Sum != "" {
			c.Properties = append(c.Properties, cdxProperty{Name: "go.sum", Value: m.Sum})
		}
		c.BOMRef = c.PURL
		doc.Components = append(doc.Components, c)
		deps = append(deps, c.BOMRef)
	}
	// The build information lists the modules, not which imports which:
	// the application depends on each of them.
	doc.Dependencies = []cdxDependency{{Ref: mainRef, DependsOn: deps}}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", fmt.Errorf("SBOM: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, sbomFile), append(data, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("SBOM: %w", err)
	}
	return sbomFile, nil
}
