// Command package builds csisupd's release packages from the release
// binary (make release): a .deb and an .rpm made with nfpm, the agent's
// OCI image (as an OCI layout and a `docker save` tarball, built with
// go-containerregistry, no container daemon), a CycloneDX SBOM of the Go
// modules in the binary, then SHA256SUMS of everything it wrote. make package runs it from the
// repository's root:
//
//	go run ./scripts/package -bin dist/csisupd -out dist
//
// Every file and time inside the packages comes from the repository and
// the binary's own stamp (`csisupd version --json`; its build time is the
// commit's), so that two runs for one commit write the same bytes.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

// Config is what one run packages.
type Config struct {
	// Binary is the release build of csisupd (make release).
	Binary string
	// Deploy is the repository's deploy/ directory: the unit, and the
	// configuration and maintainer scripts of deploy/package/.
	Deploy string
	// Out is where the packages and SHA256SUMS are written.
	Out string
	// Arch is the Go architecture of Binary.
	Arch string
	// CAFile is the CA certificate bundle the image carries.
	CAFile string
}

// build is the stamp of the binary packaged, as `csisupd version --json`
// prints it.
type build struct {
	Version   string    `json:"version"`
	Commit    string    `json:"commit"`
	Dirty     bool      `json:"dirty"`
	BuildTime time.Time `json:"build_time"`
}

func main() {
	var cfg Config
	flag.StringVar(&cfg.Binary, "bin", "dist/csisupd", "the release binary to package")
	flag.StringVar(&cfg.Deploy, "deploy", "deploy", "the repository's deploy directory")
	flag.StringVar(&cfg.Out, "out", "dist", "the directory to write the packages into")
	flag.StringVar(&cfg.Arch, "arch", "amd64", "the Go architecture of -bin")
	flag.StringVar(&cfg.CAFile, "ca-file", "/etc/ssl/certs/ca-certificates.crt", "the CA certificates to put in the image")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "package: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	written, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "package:", err)
		os.Exit(1)
	}
	for _, name := range written {
		fmt.Println(filepath.Join(cfg.Out, name))
	}
}

// Run writes the packages and SHA256SUMS into cfg.Out and returns the
// names of the files written there.
func Run(ctx context.Context, cfg Config) ([]string, error) {
	b, err := readBuild(ctx, cfg.Binary)
	if err != nil {
		return nil, err
	}
	stage, err := os.MkdirTemp("", "csisupd-package-")
	if err != nil {
		return nil, fmt.Errorf("staging directory: %w", err)
	}
	defer os.RemoveAll(stage)
	generated, err := stageFiles(ctx, cfg, b, stage)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("output directory %s: %w", cfg.Out, err)
	}
	var written []string
	for _, format := range []string{"deb", "rpm"} {
		name, err := writePackage(format, packageInfo(cfg, b, generated), cfg.Out)
		if err != nil {
			return nil, err
		}
		written = append(written, name)
	}
	img, err := buildImage(cfg, b)
	if err != nil {
		return nil, err
	}
	images, err := writeImage(cfg.Out, img, b)
	if err != nil {
		return nil, err
	}
	written = append(written, images...)
	sbom, err := writeSBOM(cfg.Out, cfg.Binary, b)
	if err != nil {
		return nil, err
	}
	written = append(written, sbom)
	sums, err := writeSums(cfg.Out, append([]string{filepath.Base(cfg.Binary)}, written...))
	if err != nil {
		return nil, err
	}
	return append(written, sums), nil
}

// readBuild runs the binary's `version --json`: the packages' version and
// times are its stamp's.
func readBuild(ctx context.Context, binary string) (build, error) {
	out, err := exec.CommandContext(ctx, binary, "version", "--json").Output()
	if err != nil {
		return build{}, fmt.Errorf("-bin %s: version --json: %w", binary, err)
	}
	var b build
	if err := json.Unmarshal(out, &b); err != nil {
		return build{}, fmt.Errorf("-bin %s: version --json: %w", binary, err)
	}
	if b.BuildTime.IsZero() {
		return build{}, fmt.Errorf("-bin %s has no build time: build it with make release, which stamps the commit's time", binary)
	}
	return b, nil
}

// Paths the packages install.
const (
	unitName    = "csisupd.service"
	debUnitDir  = "/lib/systemd/system/"
	rpmUnitDir  = "/usr/lib/systemd/system/"
	installedAt = "/usr/bin/csisupd"
	configDir   = "/etc/csisupd.d"
	dataDir     = "/var/lib/csisupd"
	pluginDir   = "/var/lib/csisupd/plugins"
	docDir      = "/usr/share/doc/csisupd"
)

// staged are the files generated into the staging directory.
type staged struct {
	unit, changelog, bash, zsh, fish string
}

// stageFiles writes the files the packages hold that are not in the
// repository as they are: the unit pointing at installedAt, the changelog
// and the shell completions.
func stageFiles(ctx context.Context, cfg Config, b build, stage string) (staged, error) {
	unitSrc := filepath.Join(cfg.Deploy, unitName)
	unit, err := os.ReadFile(unitSrc)
	if err != nil {
		return staged{}, fmt.Errorf("unit: %w", err)
	}
	const execStart = "ExecStart=/usr/local/bin/csisupd "
	if !bytes.Contains(unit, []byte(execStart)) {
		return staged{}, fmt.Errorf("unit %s: no line %q to point at %s", unitSrc, execStart, installedAt)
	}
	unit = bytes.ReplaceAll(unit, []byte(execStart), []byte("ExecStart="+installedAt+" "))
	s := staged{
		unit:      filepath.Join(stage, unitName),
		changelog: filepath.Join(stage, "changelog.gz"),
		bash:      filepath.Join(stage, "csisupd.bash"),
		zsh:       filepath.Join(stage, "_csisupd"),
		fish:      filepath.Join(stage, "csisupd.fish"),
	}
	if err := os.WriteFile(s.unit, unit, 0o644); err != nil {
		return staged{}, fmt.Errorf("unit: %w", err)
	}
	if err := writeChangelog(s.changelog, b); err != nil {
		return staged{}, err
	}
	for shell, path := range map[string]string{"bash": s.bash, "zsh": s.zsh, "fish": s.fish} {
		out, err := exec.CommandContext(ctx, cfg.Binary, "completion", shell).Output()
		if err != nil {
			return staged{}, fmt.Errorf("%s completion: %w", shell, err)
		}
		if err := os.WriteFile(path, out, 0o644); err != nil {
			return staged{}, fmt.Errorf("%s completion: %w", shell, err)
		}
	}
	return s, nil
}

// writeChangelog writes a Debian-format changelog of the one release
// packaged, gzip-compressed without a name or time in its header.
func writeChangelog(path string, b build) error {
	var text bytes.Buffer
	fmt.Fprintf(&text, "csisupd (%s) stable; urgency=medium\n\n", debVersion(b.Version))
	fmt.Fprintf(&text, "  * Release built from commit %s.\n", b.Commit)
	fmt.Fprintf(&text, "    The changes are in the repository's history up to that commit.\n\n")
	fmt.Fprintf(&text, " -- %s  %s\n", maintainer, b.BuildTime.UTC().Format(time.RFC1123Z))
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	if _, err := zw.Write(text.Bytes()); err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	if err := os.WriteFile(path, gz.Bytes(), 0o644); err != nil {
		return fmt.Errorf("changelog: %w", err)
	}
	return nil
}

// debVersion is v as Debian orders it: a pre-release sorts before its
// release with "~" (0.0.0-dev+abc becomes 0.0.0~dev+abc).
func debVersion(v string) string {
	return strings.Replace(v, "-", "~", 1)
}

const maintainer = "csisupd developers <csisupd@users.noreply.github.com>"

// packageInfo describes the package: the same files for each format but
// for the unit's directory and the zsh completions', the formats' own.
func packageInfo(cfg Config, b build, s staged) *nfpm.Info {
	pkg := filepath.Join(cfg.Deploy, "package")
	mtime := b.BuildTime.UTC()
	file := func(src, dst string, mode os.FileMode) *files.Content {
		return &files.Content{Source: src, Destination: dst, FileInfo: &files.ContentFileInfo{Mode: mode, MTime: mtime}}
	}
	dir := func(dst string, mode os.FileMode) *files.Content {
		return &files.Content{Destination: dst, Type: files.TypeDir, FileInfo: &files.ContentFileInfo{Mode: mode, MTime: mtime}}
	}
	conffile := func(src, dst string, mode os.FileMode) *files.Content {
		c := file(src, dst, mode)
		c.Type = files.TypeConfigNoReplace
		return c
	}
	only := func(packager string, c *files.Content) *files.Content {
		c.Packager = packager
		return c
	}
	contents := files.Contents{
		file(cfg.Binary, installedAt, 0o755),
		only("deb", file(s.unit, debUnitDir+unitName, 0o644)),
		only("rpm", file(s.unit, rpmUnitDir+unitName, 0o644)),
		dir(configDir, 0o755),
		conffile(filepath.Join(pkg, "agent.hcl"), configDir+"/agent.hcl", 0o644),
		// Secrets: the agent's and Consul's tokens.
		conffile(filepath.Join(pkg, "csisupd.env"), configDir+"/csisupd.env", 0o600),
		// data_dir is the agent's alone; plugin_dir is where plugins put
		// their sockets, mode 0750 owned by root, as the agent's trust
		// check wants it (client.allow_insecure_plugin_dir).
		dir(dataDir, 0o700),
		dir(pluginDir, 0o750),
		// Debian names the changelog of a package with a revision
		// changelog.Debian.gz, and wants a copyright file and the
		// overrides of lintian's tags that do not apply.
		only("deb", file(s.changelog, docDir+"/changelog.Debian.gz", 0o644)),
		only("rpm", file(s.changelog, docDir+"/changelog.gz", 0o644)),
		file(filepath.Join(pkg, "copyright"), docDir+"/copyright", 0o644),
		only("deb", file(filepath.Join(pkg, "lintian-overrides"), "/usr/share/lintian/overrides/csisupd", 0o644)),
		file(s.bash, "/usr/share/bash-completion/completions/csisupd", 0o644),
		only("deb", file(s.zsh, "/usr/share/zsh/vendor-completions/_csisupd", 0o644)),
		only("rpm", file(s.zsh, "/usr/share/zsh/site-functions/_csisupd", 0o644)),
		file(s.fish, "/usr/share/fish/vendor_completions.d/csisupd.fish", 0o644),
	}
	info := &nfpm.Info{
		Name:        "csisupd",
		Arch:        cfg.Arch,
		Platform:    "linux",
		Version:     b.Version,
		Release:     "1",
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  maintainer,
		Vendor:      "csisupd",
		Homepage:    "https://github.com/csisupd/csisupd",
		Description: "CSI plugin supervisor\ncsisupd supervises the CSI plugins of a node (health, registration, volume\nstaging and publishing) and, as a server, keeps the cluster's volumes and\nclaims. The package installs the node agent's service, disabled.",
		MTime:       mtime,
		Overridables: nfpm.Overridables{
			Contents: contents,
			Umask:    0o022,
			Scripts: nfpm.Scripts{
				PostInstall: filepath.Join(pkg, "scripts", "postinstall.sh"),
				PreRemove:   filepath.Join(pkg, "scripts", "preremove.sh"),
				PostRemove:  filepath.Join(pkg, "scripts", "postremove.sh"),
			},
			// The host name of the machine that built it would make each
			// machine's package differ.
			RPM: nfpm.RPM{BuildHost: "csisupd", Group: "System Environment/Daemons", Summary: "CSI plugin supervisor"},
		},
	}
	if b.Dirty {
		info.Description += "\nBuilt from a working tree with uncommitted changes."
	}
	return nfpm.WithDefaults(info)
}

// writePackage writes info as format into out and returns the file's name.
func writePackage(format string, info *nfpm.Info, out string) (name string, err error) {
	packager, err := nfpm.Get(format)
	if err != nil {
		return "", fmt.Errorf("%s: %w", format, err)
	}
	if err := nfpm.PrepareForPackager(info, format); err != nil {
		return "", fmt.Errorf("%s contents: %w", format, err)
	}
	info.Target = ""
	name = packager.ConventionalFileName(info)
	path := filepath.Join(out, name)
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", format, err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: %w", path, cerr)
		}
	}()
	if err := packager.Package(info, f); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return name, nil
}

// writeSums writes SHA256SUMS of names (files in dir), in sha256sum's
// format and name order, and returns its name.
func writeSums(dir string, names []string) (string, error) {
	names = slices.Sorted(slices.Values(names))
	var sums bytes.Buffer
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("SHA256SUMS: %w", err)
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&sums, "%s  %s\n", hex.EncodeToString(sum[:]), name)
	}
	const name = "SHA256SUMS"
	if err := os.WriteFile(filepath.Join(dir, name), sums.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return name, nil
}
