package main

import (
	"fmt"
	"io"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// devVersion is the version of a build from a commit that no release tag
// names; the commit follows it as semver build metadata.
const devVersion = "0.0.0-dev"

// stamp is what the build wrote into the binary with -ldflags -X; an empty
// field is one the build did not set.
type stamp struct {
	version string // git describe --tags, a leading "v" removed
	commit  string // the full commit id
	dirty   string // "true" or "false"
	epoch   string // SOURCE_DATE_EPOCH: the commit's time in Unix seconds
}

// buildInfo is the build of this binary, as `csisupd version` prints it.
type buildInfo struct {
	Version   string
	Commit    string
	Dirty     bool
	Go        string
	BuildTime time.Time // zero when the build recorded none
}

// pseudoVersion matches the Go module pseudo-versions that the go command
// gives an untagged commit (vX.Y.Z-[pre.]yyyymmddhhmmss-abcdefabcdef).
var pseudoVersion = regexp.MustCompile(`[-.]\d{14}-[0-9a-f]{12}(\+.*)?$`)

// releaseVersion matches a module version of a release tag.
var releaseVersion = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

// currentBuild is the build of the running binary: what -ldflags stamped,
// else the go command's own record of the module and its VCS state.
func currentBuild() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return resolveBuild(stamp{version: version, commit: commit, dirty: dirty, epoch: buildEpoch}, bi, runtime.Version())
}

// resolveBuild combines the stamp with bi (nil when the binary has no
// build information): a stamped field wins, then the vcs.* settings the go
// command records, then the module version of a `go install ...@vX.Y.Z`.
// Without a release version it is devVersion+<short commit>.
func resolveBuild(s stamp, bi *debug.BuildInfo, goVersion string) buildInfo {
	b := buildInfo{Version: strings.TrimPrefix(s.version, "v"), Commit: s.commit, Go: goVersion}
	var vcsTime, vcsModified string
	if bi != nil {
		if bi.GoVersion != "" {
			b.Go = bi.GoVersion
		}
		for _, setting := range bi.Settings {
			switch setting.Key {
			case "vcs.revision":
				if b.Commit == "" {
					b.Commit = setting.Value
				}
			case "vcs.time":
				vcsTime = setting.Value
			case "vcs.modified":
				vcsModified = setting.Value
			}
		}
		if v := bi.Main.Version; b.Version == "" && releaseVersion.MatchString(v) && !pseudoVersion.MatchString(v) {
			b.Version = strings.TrimPrefix(v, "v")
		}
	}
	if s.dirty != "" {
		b.Dirty = s.dirty == "true"
	} else {
		b.Dirty = vcsModified == "true"
	}
	if sec, err := strconv.ParseInt(s.epoch, 10, 64); err == nil {
		b.BuildTime = time.Unix(sec, 0).UTC()
	} else if t, err := time.Parse(time.RFC3339, vcsTime); err == nil {
		b.BuildTime = t.UTC()
	}
	if b.Version == "" {
		b.Version = devVersion
		if short := shortCommit(b.Commit); short != "" {
			b.Version += "+" + short
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

// shortCommit is the first 12 hex digits of a commit id, as Go's
// pseudo-versions abbreviate it; "" for no commit.
func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// proto is b as `version --json` prints it.
func (b buildInfo) proto() *csisupdv1.VersionInfo {
	v := &csisupdv1.VersionInfo{Version: b.Version, Commit: b.Commit, Go: b.Go, Dirty: b.Dirty}
	if !b.BuildTime.IsZero() {
		v.BuildTime = timestamppb.New(b.BuildTime)
	}
	return v
}

// String is b as `csisupd version` prints it: one line.
func (b buildInfo) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "csisupd %s (commit %s, %s", b.Version, b.Commit, b.Go)
	if !b.BuildTime.IsZero() {
		fmt.Fprintf(&sb, ", built %s", b.BuildTime.Format(time.RFC3339))
	}
	if b.Dirty {
		sb.WriteString(", dirty tree")
	}
	sb.WriteString(")")
	return sb.String()
}

// printVersion writes the build of this binary to w, as JSON when asJSON.
func printVersion(w io.Writer, asJSON bool) error {
	b := currentBuild()
	if asJSON {
		return printProto(w, b.proto())
	}
	_, err := fmt.Fprintln(w, b.String())
	return err
}

func newVersionCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the csisupd version",
		Long: "Print the version of this csisupd binary: its release (or 0.0.0-dev+COMMIT for a build\n" +
			"of an untagged commit), commit, whether the tree was dirty, Go release and build time.\n" +
			"`csisupd --version` prints the same.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd.OutOrStdout(), opts.json)
		},
	}
}
