package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// archiveFile is one file of a debug archive.
type archiveFile struct {
	data []byte
	mode int64
}

// readArchive returns the files of the debug archive at path by their
// path in the bundle, without the archive's top directory, which it
// checks is the archive's name.
func readArchive(t *testing.T, path string) map[string]archiveFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	top := strings.TrimSuffix(filepath.Base(path), ".tar.gz") + "/"
	files := map[string]archiveFile{}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		name, ok := strings.CutPrefix(hdr.Name, top)
		if !ok || hdr.Typeflag != tar.TypeReg {
			t.Fatalf("archive entry %s (type %c) is not a file under %s", hdr.Name, hdr.Typeflag, top)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = archiveFile{data: data, mode: hdr.Mode}
	}
}

// A part that cannot be collected is recorded in the manifest and the
// bundle goes on. Against an agent without the server role, without ACLs
// and enable_debug, and with a logger that cannot be monitored, the bundle
// holds the agent's state and records the rest; against a server without
// the Agent service, it holds the cluster's state. Either way the archive
// holds exactly the files its manifest lists, all with mode 0600.
func TestOperatorDebugRecordsFailedParts(t *testing.T) {
	c, server := oneNodeCluster(t)
	agentParts := []string{"agent/status.json", "agent/events.json", "agent/config.hcl", "agent/metrics/0000.prom"}
	clusterParts := []string{"cluster/plugins.json", "cluster/nodes.json", "cluster/volumes.json", "cluster/raft-peers.json"}
	tests := []struct {
		name   string
		addr   string
		files  []string
		failed map[string]string // part: a piece of its error
		// has is a piece of one file's content.
		has map[string]string
	}{
		{
			name: "agent", addr: c.Agent(0).RPCAddr, files: agentParts,
			failed: map[string]string{
				"agent/pprof/cpu.prof":      "profiling is off",
				"agent/pprof/heap.prof":     "profiling is off",
				"agent/pprof/goroutine.txt": "profiling is off",
				"agent/monitor.log":         "cannot be monitored",
				"cluster/plugins.json":      "is not a server",
				"cluster/nodes.json":        "is not a server",
				"cluster/volumes.json":      "is not a server",
				"cluster/raft-peers.json":   "is not a server",
			},
			has: map[string]string{
				"agent/status.json":       `"id": "tp"`,
				"agent/events.json":       `"type":"plugin-registered","plugin_id":"tp"`,
				"agent/config.hcl":        "enable_debug = false\n",
				"agent/metrics/0000.prom": "go_goroutines",
			},
		},
		{
			name: "server without the Agent service", addr: server, files: clusterParts,
			failed: map[string]string{"agent/status.json": "unknown service csisupd.v1.Agent", "agent/monitor.log": "unknown service csisupd.v1.Agent"},
			has:    map[string]string{"cluster/plugins.json": `"id": "tp"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			out, err := execute(t, "--address", tt.addr, "operator", "debug", "--duration", "1s", "--interval", "400ms", "--output", dir, "--json")
			if err != nil {
				t.Fatal(err)
			}
			var res csisupdv1.DebugResult
			if err := protojson.Unmarshal([]byte(out), &res); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if filepath.Dir(res.GetFile()) != dir || !strings.HasPrefix(filepath.Base(res.GetFile()), "csisupd-debug-") {
				t.Fatalf("archive %s, want csisupd-debug-* in %s", res.GetFile(), dir)
			}
			info, err := os.Stat(res.GetFile())
			if err != nil || info.Mode().Perm() != 0o600 {
				t.Fatalf("archive: %v, %v; want mode 0600", info, err)
			}
			files := readArchive(t, res.GetFile())
			manifest, err := debugManifestOf(files)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(manifest, res.GetManifest()) {
				t.Errorf("printed manifest %v, archived %v", res.GetManifest(), manifest)
			}
			var inArchive []string
			for name, f := range files {
				if f.mode != 0o600 {
					t.Errorf("%s has mode %o, want 600", name, f.mode)
				}
				if name != "manifest.json" {
					inArchive = append(inArchive, name)
				}
			}
			slices.Sort(inArchive)
			if !slices.Equal(inArchive, manifest.GetFiles()) {
				t.Errorf("archive holds %v, manifest lists %v", inArchive, manifest.GetFiles())
			}
			for _, want := range tt.files {
				if !slices.Contains(manifest.GetFiles(), want) {
					t.Errorf("no %s in %v (errors %v)", want, manifest.GetFiles(), manifest.GetErrors())
				}
			}
			for name, want := range tt.has {
				if !strings.Contains(string(files[name].data), want) {
					t.Errorf("%s lacks %q:\n%.500s", name, want, files[name].data)
				}
			}
			failed := map[string]string{}
			for _, e := range manifest.GetErrors() {
				failed[e.GetPart()] = e.GetError()
				if slices.Contains(manifest.GetFiles(), e.GetPart()) {
					t.Errorf("%s failed (%s) and is in the archive", e.GetPart(), e.GetError())
				}
			}
			for part, want := range tt.failed {
				if !strings.Contains(failed[part], want) {
					t.Errorf("error of %s = %q, want one with %q", part, failed[part], want)
				}
			}
			if tt.name != "agent" {
				return
			}
			if len(failed) != len(tt.failed) {
				t.Errorf("errors %v, want only %v", failed, tt.failed)
			}
			// Metrics: one snapshot at the start, one per interval, one
			// at the end, numbered from 0000 without a gap.
			var snapshots []string
			for _, name := range manifest.GetFiles() {
				if strings.HasPrefix(name, "agent/metrics/") {
					snapshots = append(snapshots, name)
				}
			}
			for i, name := range snapshots {
				if want := fmt.Sprintf("agent/metrics/%04d.prom", i); name != want {
					t.Errorf("metrics snapshot %d is %s, want %s", i, name, want)
				}
			}
			if len(snapshots) < 2 {
				t.Errorf("metrics snapshots %v, want at least one at the start and one at the end", snapshots)
			}
		})
	}
}

// debugManifestOf decodes the manifest of an archive.
func debugManifestOf(files map[string]archiveFile) (*csisupdv1.DebugManifest, error) {
	f, ok := files["manifest.json"]
	if !ok {
		return nil, errors.New("the archive has no manifest.json")
	}
	m := &csisupdv1.DebugManifest{}
	return m, protojson.Unmarshal(f.data, m)
}

// Without an agent nothing is collected: exit code 1 and no archive.
func TestOperatorDebugWithoutAgent(t *testing.T) {
	t.Setenv("CSISUPD_ADDR", "")
	dir := t.TempDir()
	addr := testutil.FreeAddr(t)
	if code := run([]string{"--address", addr, "--timeout", "2s", "operator", "debug", "--duration", "1s", "--output", dir}); code != exitError {
		t.Errorf("exit code %d, want %d", code, exitError)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left %v in the output directory", entries)
	}
	for _, args := range [][]string{{"--duration", "0s"}, {"--interval", "-1s"}} {
		if code := run(append([]string{"--address", addr, "operator", "debug", "--output", dir}, args...)); code != exitUsage {
			t.Errorf("operator debug %v: exit code %d, want %d", args, code, exitUsage)
		}
	}
}

func TestMonitorUsage(t *testing.T) {
	if code := run([]string{"--address", testutil.FreeAddr(t), "monitor", "--log-level", "verbose"}); code != exitUsage {
		t.Errorf("monitor --log-level verbose: exit code %d, want %d", code, exitUsage)
	}
}

// Text log lines a terminal would interpret are printed quoted; JSON lines
// as they are.
func TestWriteLogLines(t *testing.T) {
	tests := []struct {
		in   string
		json bool
		want string
	}{
		{"a line\nanother\n", false, "a line\nanother\n"},
		{"bad \x1b[2J line\n", false, "\"bad \\x1b[2J line\"\n"},
		{"{\"@message\":\"x\"}\n", true, "{\"@message\":\"x\"}\n"},
	}
	for _, tt := range tests {
		var b strings.Builder
		if err := writeLogLines(&b, []byte(tt.in), tt.json); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("writeLogLines(%q) = %q, want %q", tt.in, b.String(), tt.want)
		}
	}
}
