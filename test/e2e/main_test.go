package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// binary is the csisupd binary built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m, testutil.Binary{Pkg: "github.com/csisupd/csisupd/cmd/csisupd", Path: &binary})
}

// cliResult is one run of the CLI.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the csisupd binary with args against addr and returns its
// output and exit code. The environment carries no CSISUPD_* variables.
func cli(t *testing.T, addr string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"--address", addr, "--timeout", "20s"}, args...)...)
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cliResult{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	default:
		t.Fatalf("csisupd %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// cliJSON runs the CLI with --json, requires exit code 0 and decodes
// stdout into v.
func cliJSON(t *testing.T, addr string, v any, args ...string) {
	t.Helper()
	res := cli(t, addr, append(args, "--json")...)
	if res.code != 0 {
		t.Fatalf("csisupd %s: exit %d: %s", strings.Join(args, " "), res.code, res.stderr)
	}
	if err := json.Unmarshal([]byte(res.stdout), v); err != nil {
		t.Fatalf("csisupd %s --json: %v\n%s", strings.Join(args, " "), err, res.stdout)
	}
}

// cleanEnv is the test's environment without CSISUPD_* variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSISUPD_") {
			env = append(env, kv)
		}
	}
	return env
}

// The JSON documents of the CLI, as far as these tests read them.
type (
	pluginDoc struct {
		ID                  string `json:"id"`
		Provider            string `json:"provider"`
		ControllersHealthy  int    `json:"controllers_healthy"`
		ControllersExpected int    `json:"controllers_expected"`
		NodesHealthy        int    `json:"nodes_healthy"`
		NodesExpected       int    `json:"nodes_expected"`
		Instances           []struct {
			NodeID   string `json:"node_id"`
			NodeName string `json:"node_name"`
			Healthy  bool   `json:"healthy"`
			// Plugin is the instance as its node reported it; its node_id
			// is the CSI node id.
			Plugin struct {
				Type   string `json:"type"`
				NodeID string `json:"node_id"`
			} `json:"plugin"`
		} `json:"instances"`
	}
	nodeDoc struct {
		ID      string `json:"id"`
		Name    string `json:"name"`
		Address string `json:"address"`
		Status  string `json:"status"`
		Plugins []struct {
			ID      string `json:"id"`
			NodeID  string `json:"node_id"`
			Healthy bool   `json:"healthy"`
		} `json:"plugins"`
	}
	nodeListDoc struct {
		Nodes []nodeDoc `json:"nodes"`
	}
	claimDoc struct {
		NodeID              string            `json:"node_id"`
		CSINodeID           string            `json:"csi_node_id"`
		ReadOnly            bool              `json:"read_only"`
		PublishContext      map[string]string `json:"publish_context"`
		WorkloadID          string            `json:"workload_id"`
		Owner               string            `json:"owner"`
		State               string            `json:"state"`
		HostPath            string            `json:"host_path"`
		StagingPath         string            `json:"staging_path"`
		ControllerPublished bool              `json:"controller_published"`
		Mounted             bool              `json:"mounted"`
		LastError           string            `json:"last_error"`
	}
	volumeDoc struct {
		ID               string            `json:"id"`
		PluginID         string            `json:"plugin_id"`
		ExternalID       string            `json:"external_id"`
		CapacityBytes    int64             `json:"capacity_bytes,string"` // an int64: a string in JSON
		Parameters       map[string]string `json:"parameters"`
		Claims           []claimDoc        `json:"claims"`
		ControllerNodeID string            `json:"controller_node_id"`
	}
	volumeListDoc struct {
		Volumes []volumeDoc `json:"volumes"`
	}
	peersDoc struct {
		Peers []struct {
			ID       string `json:"id"`
			Suffrage string `json:"suffrage"`
			Leader   bool   `json:"leader"`
		} `json:"peers"`
	}
)

// pluginVolume is the test plugin's record of a volume in its state dir.
type pluginVolume struct {
	ID            string                     `json:"id"`
	Name          string                     `json:"name"`
	CapacityBytes int64                      `json:"capacity_bytes"`
	Published     map[string]json.RawMessage `json:"published"`
}

// readPluginVolume reads the test plugin's record of volume id from its
// state dir; ok is false when there is none.
func readPluginVolume(t *testing.T, stateDir, id string) (v pluginVolume, ok bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "volumes", id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return v, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("plugin record of %s: %v", id, err)
	}
	return v, true
}

// jsonInto decodes s into v and reports whether it could.
func jsonInto(s string, v any) bool { return json.Unmarshal([]byte(s), v) == nil }

// tryPlugin runs `plugin status ID --json` and reports whether it
// succeeded.
func tryPlugin(t *testing.T, addr, id string) (pluginDoc, bool) {
	t.Helper()
	res := cli(t, addr, "plugin", "status", id, "--json")
	var p pluginDoc
	if res.code != 0 || !jsonInto(res.stdout, &p) {
		return p, false
	}
	return p, true
}

// startTestPlugin starts a test plugin in the test process; it outlives
// the agents the test kills, and stops when the test ends. Its mounts, if
// any, are undone then too: create the directories they live in before,
// so that they are removed after.
func startTestPlugin(t *testing.T, cfg testplugin.Config) *testplugin.Plugin {
	t.Helper()
	p, err := testplugin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	unmountAtEnd(t, p)
	return p
}

// pluginMounts is the Config.Mounts of the tests' node plugins: real bind
// mounts when this process can make them, so that the claim tests check
// the mount table; else markers, and the test says why.
func pluginMounts(t *testing.T) string {
	t.Helper()
	if ok, reason := testplugin.RealMountsAvailable(); !ok {
		t.Logf("the test plugins link rather than mount: %s", reason)
		return testplugin.MountsMarker
	}
	return testplugin.MountsBind
}

// unmountAtEnd undoes p's mounts when the test ends: they outlive the
// plugin, as a driver's outlive its process.
func unmountAtEnd(t *testing.T, p *testplugin.Plugin) {
	t.Cleanup(func() {
		if err := p.UnmountAll(); err != nil {
			t.Errorf("unmount the test plugin's mounts: %v", err)
		}
	})
}

// mounts reports whether p makes real mounts, so that a test checks the
// mount table; with markers there is none to check, and the plugin's
// records tell what it holds.
func mounts(p *testplugin.Plugin) bool {
	return p.Config().Mounts == testplugin.MountsBind
}

// wantMountPoints fails the test unless each path is a mount point, or
// none is, as want says, when p makes real mounts.
func wantMountPoints(t *testing.T, p *testplugin.Plugin, want bool, paths ...string) {
	t.Helper()
	if !mounts(p) {
		return
	}
	for _, path := range paths {
		got, err := testplugin.IsMountPoint(path)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s is a mount point: %v, want %v", path, got, want)
		}
	}
}

// mountsLeft returns the paths p was ever asked to stage or publish at
// that are mount points now; none when p makes no real mounts.
func mountsLeft(t *testing.T, p *testplugin.Plugin) []string {
	t.Helper()
	if !mounts(p) {
		return nil
	}
	var left []string
	for _, c := range p.NodeLog() {
		if c.Method != "NodeStageVolume" && c.Method != "NodePublishVolume" || slices.Contains(left, c.Path) {
			continue
		}
		mounted, err := testplugin.IsMountPoint(c.Path)
		if err != nil {
			t.Fatal(err)
		}
		if mounted {
			left = append(left, c.Path)
		}
	}
	return left
}
