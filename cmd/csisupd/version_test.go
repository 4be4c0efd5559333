package main

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestResolveBuild(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	commitTime := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	vcs := func(mainVersion string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/csisupd/csisupd", Version: mainVersion}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	tests := []struct {
		name  string
		stamp stamp
		bi    *debug.BuildInfo
		want  buildInfo
	}{
		{
			name:  "release build stamped by the Makefile",
			stamp: stamp{version: "v1.2.0", commit: rev, dirty: "false", epoch: "1796641200"},
			bi:    vcs("(devel)"),
			want:  buildInfo{Version: "1.2.0", Commit: rev, Go: "go1.26.8", BuildTime: commitTime},
		},
		{
			name:  "stamp wins over the vcs settings",
			stamp: stamp{version: "1.2.0-3-gabcdef0", commit: rev, dirty: "true", epoch: "1796641200"},
			bi:    vcs("(devel)", "vcs.revision", "ffffffffffffffffffffffffffffffffffffffff", "vcs.modified", "false", "vcs.time", "2020-01-01T00:00:00Z"),
			want:  buildInfo{Version: "1.2.0-3-gabcdef0", Commit: rev, Dirty: true, Go: "go1.26.8", BuildTime: commitTime},
		},
		{
			name: "untagged go build falls back to the vcs settings",
			bi:   vcs("v0.0.0-20261207110000-0123456789ab+dirty", "vcs.revision", rev, "vcs.modified", "true", "vcs.time", "2026-12-07T11:00:00Z"),
			want: buildInfo{Version: "0.0.0-dev+0123456789ab", Commit: rev, Dirty: true, Go: "go1.26.8", BuildTime: commitTime},
		},
		{
			name: "pseudo-version after a tag is a dev version",
			bi:   vcs("v1.2.1-0.20261207110000-0123456789ab", "vcs.revision", rev, "vcs.modified", "false", "vcs.time", "2026-12-07T11:00:00Z"),
			want: buildInfo{Version: "0.0.0-dev+0123456789ab", Commit: rev, Go: "go1.26.8", BuildTime: commitTime},
		},
		{
			name: "go install of a release tag",
			bi:   vcs("v1.3.0"),
			want: buildInfo{Version: "1.3.0", Commit: "unknown", Go: "go1.26.8"},
		},
		{
			name: "go install of a release candidate",
			bi:   vcs("v1.3.0-rc.1"),
			want: buildInfo{Version: "1.3.0-rc.1", Commit: "unknown", Go: "go1.26.8"},
		},
		{
			name:  "only the commit stamped",
			stamp: stamp{commit: rev},
			want:  buildInfo{Version: "0.0.0-dev+0123456789ab", Commit: rev, Go: "go1.99"},
		},
		{
			name: "nothing recorded",
			want: buildInfo{Version: "0.0.0-dev", Commit: "unknown", Go: "go1.99"},
		},
		{
			name:  "an epoch that is not a number is no build time",
			stamp: stamp{commit: "abc1234", epoch: "yesterday"},
			want:  buildInfo{Version: "0.0.0-dev+abc1234", Commit: "abc1234", Go: "go1.99"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := resolveBuild(tt.stamp, tt.bi, "go1.99")
			if !got.BuildTime.Equal(tt.want.BuildTime) {
				t.Errorf("build time = %v, want %v", got.BuildTime, tt.want.BuildTime)
			}
			got.BuildTime, tt.want.BuildTime = time.Time{}, time.Time{}
			if got != tt.want {
				t.Errorf("resolveBuild = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBuildInfoText(t *testing.T) {
	at := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	tests := []struct {
		b    buildInfo
		want string
	}{
		{buildInfo{Version: "1.2.0", Commit: "abc", Go: "go1.26.8", BuildTime: at},
			"csisupd 1.2.0 (commit abc, go1.26.8, built 2026-12-07T11:00:00Z)"},
		{buildInfo{Version: "1.2.0", Commit: "abc", Dirty: true, Go: "go1.26.8", BuildTime: at},
			"csisupd 1.2.0 (commit abc, go1.26.8, built 2026-12-07T11:00:00Z, dirty tree)"},
		{buildInfo{Version: "0.0.0-dev+abc", Commit: "abc", Dirty: true, Go: "go1.26.8"},
			"csisupd 0.0.0-dev+abc (commit abc, go1.26.8, dirty tree)"},
	}
	for _, tt := range tests {
		if got := tt.b.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
		v := tt.b.proto()
		if v.GetVersion() != tt.b.Version || v.GetCommit() != tt.b.Commit || v.GetDirty() != tt.b.Dirty || v.GetGo() != tt.b.Go {
			t.Errorf("proto() = %v, want the fields of %+v", v, tt.b)
		}
		switch {
		case tt.b.BuildTime.IsZero() && v.GetBuildTime() != nil:
			t.Errorf("proto() build_time = %v, want none", v.GetBuildTime())
		case !tt.b.BuildTime.IsZero() && !v.GetBuildTime().AsTime().Equal(tt.b.BuildTime):
			t.Errorf("proto() build_time = %v, want %v", v.GetBuildTime(), tt.b.BuildTime)
		}
	}
}

// --version (and -v) print exactly what the version command prints, as
// text and as JSON; the bare command still prints its help.
func TestVersionFlag(t *testing.T) {
	execute := func(args ...string) string {
		t.Helper()
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String()
	}
	for _, tt := range []struct{ flag, command []string }{
		{[]string{"--version"}, []string{"version"}},
		{[]string{"-v"}, []string{"version"}},
		{[]string{"--version", "--json"}, []string{"version", "--json"}},
	} {
		got, want := execute(tt.flag...), execute(tt.command...)
		if got != want || !strings.HasPrefix(got, "csisupd ") && !strings.HasPrefix(got, "{") {
			t.Errorf("%v printed %q, want what %v prints: %q", tt.flag, got, tt.command, want)
		}
	}
	if help := execute(); !strings.Contains(help, "Usage:") || !strings.Contains(help, "--version") {
		t.Errorf("csisupd without arguments printed %q, want its help listing --version", help)
	}
	if got := run([]string{"--version"}); got != exitOK {
		t.Errorf("run(--version) = %d, want %d", got, exitOK)
	}
}
