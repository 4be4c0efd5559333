package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/testutil"
)

// New creates a missing plugin directory with mode 0750 (less when the
// umask takes more away), never group- or world-writable.
func TestNewCreatesPluginDir0750(t *testing.T) {
	cfg := testConfig(t)
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	fi, err := os.Stat(cfg.Client.PluginDir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&^0o750 != 0 || perm&0o700 != 0o700 {
		t.Errorf("plugin directory created with mode %s, want 0750", fi.Mode())
	}
}

// New refuses a plugin directory that others can write to, or whose
// parent others can write to: the error names client.plugin_dir, the
// path, the mode found, how to fix it and the key that allows it.
func TestNewRefusesAnInsecurePluginDir(t *testing.T) {
	tests := []struct {
		name string
		// open makes the plugin directory of cfg insecure and returns the
		// directory at fault.
		open func(t *testing.T, pluginDir string) string
		want []string
	}{
		{"world-writable", func(t *testing.T, dir string) string {
			chmodDir(t, dir, 0o777)
			return dir
		}, []string{"mode drwxrwxrwx", "writable by others", "fix: chmod go-w "}},
		{"group-writable", func(t *testing.T, dir string) string {
			chmodDir(t, dir, 0o770)
			return dir
		}, []string{"mode drwxrwx---", "writable by its group", "fix: chmod go-w "}},
		{"parent writable by others", func(t *testing.T, dir string) string {
			chmodDir(t, filepath.Dir(dir), 0o777)
			return filepath.Dir(dir)
		}, []string{"parent directory ", "without the sticky bit", "fix: chmod o-w "}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if err := os.MkdirAll(cfg.Client.PluginDir, 0o750); err != nil {
				t.Fatal(err)
			}
			at := tt.open(t, cfg.Client.PluginDir)
			a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
			if err == nil {
				a.Close()
				t.Fatal("New accepted an insecure plugin directory")
			}
			want := append([]string{"client.plugin_dir", cfg.Client.PluginDir, at, "client.allow_insecure_plugin_dir = true"}, tt.want...)
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// With client.allow_insecure_plugin_dir the agent starts on a
// world-writable plugin directory, and says so in a warning.
func TestNewAllowsAnInsecurePluginDirWithAWarning(t *testing.T) {
	cfg := testConfig(t)
	cfg.Client.AllowInsecurePluginDir = true
	if err := os.MkdirAll(cfg.Client.PluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	chmodDir(t, cfg.Client.PluginDir, 0o777)
	var logs testutil.SyncBuffer
	a, err := New(Config{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})})
	if err != nil {
		t.Fatalf("New with client.allow_insecure_plugin_dir: %v", err)
	}
	defer a.Close()
	out := logs.String()
	for _, w := range []string{"[WARN]", "client.plugin_dir", "client.allow_insecure_plugin_dir = true", "writable by others", cfg.Client.PluginDir} {
		if !strings.Contains(out, w) {
			t.Errorf("log does not contain %q:\n%s", w, out)
		}
	}
}

func chmodDir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}
