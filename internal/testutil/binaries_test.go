package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPrebuiltName(t *testing.T) {
	for _, tc := range []struct {
		pkg  string
		race bool
		tags string
		want string
	}{
		{"github.com/csisupd/csisupd/cmd/csisupd", false, "", "csisupd"},
		{"github.com/csisupd/csisupd/cmd/csisupd", true, "", "csisupd-race"},
		{"github.com/csisupd/csisupd/cmd/csisupd", false, "nemesis_defect_leak", "csisupd-nemesis_defect_leak"},
		{"github.com/csisupd/csisupd/cmd/csisupd", true, "a,b", "csisupd-a-b-race"},
		{"github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin", false, "", "csi-testplugin"},
	} {
		if got := PrebuiltName(tc.pkg, tc.race, tc.tags); got != tc.want {
			t.Errorf("PrebuiltName(%q, %v, %q) = %q, want %q", tc.pkg, tc.race, tc.tags, got, tc.want)
		}
	}
}

// TestBuildUsesThePrebuiltBinary: with BinDirEnv set, Build links the
// binary found there under PrebuiltName and builds nothing (the package
// named does not exist, so a build would fail).
func TestBuildUsesThePrebuiltBinary(t *testing.T) {
	pre := t.TempDir()
	pkg := "example.invalid/cmd/nothere"
	if err := os.WriteFile(filepath.Join(pre, "nothere-race"), []byte("prebuilt"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(BinDirEnv, pre)
	out := filepath.Join(t.TempDir(), "bin")
	if err := Build(pkg, true, "", out); err != nil {
		t.Fatalf("Build with the prebuilt binary: %v", err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "prebuilt" {
		t.Fatalf("Build's output reads %q, %v; want the prebuilt binary", b, err)
	}
	// Without the race detector no prebuilt binary matches: Build builds,
	// and fails naming the package.
	if err := Build(pkg, false, "", filepath.Join(t.TempDir(), "bin")); err == nil {
		t.Fatal("Build of a package that does not exist succeeded")
	}
}
