package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/encoding/protojson"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestSecretsFileStaysOnTheNode claims and releases a volume of a plugin
// that needs a token only the agent's secrets file holds, and looks for
// the token in every log line (at trace level), the debug bundles of the
// agent and the server, and both /metrics pages.
func TestSecretsFileStaysOnTheNode(t *testing.T) {
	token := fmt.Sprintf("marker-token-%d", time.Now().UnixNano())
	logs := &testutil.SyncBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs}),
		AgentConfig: func(_ int, dir string) string {
			file := filepath.Join(dir, "tp.hcl")
			if err := os.WriteFile(file, []byte("default {\n  token = \""+token+"\"\n}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("plugin \"tp\" {\n  secrets_file = %q\n}\n", file)
		},
	})
	c.Agent(0).StartPlugin("tp", testplugin.Config{NodeID: "csi-a", RequiredSecrets: map[string]string{"token": token}})
	addr := c.Member(0).RPCAddr
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy", func() bool {
		out, err := execute(t, "--address", addr, "plugin", "status", "tp", "--json")
		var p csisupdv1.ClusterPlugin
		return err == nil && protojson.Unmarshal([]byte(out), &p) == nil && p.GetNodesHealthy() == 1
	})
	for _, args := range [][]string{
		{"volume", "create", "data", "--plugin", "tp", "--capacity", "1MiB"},
		{"volume", "claim", "data", "--node", c.Agent(0).Name, "--workload", "w1"},
		{"volume", "release", "data", "--node", c.Agent(0).Name, "--workload", "w1"},
		{"volume", "delete", "data"},
	} {
		if out, err := execute(t, append([]string{"--address", addr}, args...)...); err != nil || strings.Contains(out, token) {
			t.Fatalf("%s: %v (output holds the token: %v)", strings.Join(args, " "), err, strings.Contains(out, token))
		}
	}

	for _, from := range []string{c.Agent(0).RPCAddr, addr} {
		dir := t.TempDir()
		out, err := execute(t, "--address", from, "operator", "debug", "--duration", "1s", "--interval", "400ms", "--output", dir, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var res csisupdv1.DebugResult
		if err := protojson.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		for name, f := range readArchive(t, res.GetFile()) {
			if strings.Contains(string(f.data), token) {
				t.Errorf("debug bundle of %s: %s holds the token", from, name)
			}
		}
	}
	for _, url := range []string{"http://" + c.Agent(0).HTTPAddr + "/metrics"} {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "go_goroutines") || strings.Contains(string(body), token) {
			t.Errorf("%s: %d bytes, holds the token: %v", url, len(body), strings.Contains(string(body), token))
		}
	}
	if !strings.Contains(logs.String(), "secrets file read") {
		t.Fatal("the log never says the secrets file was read: the check below proves nothing")
	}
	if strings.Contains(logs.String(), token) {
		t.Error("a log line holds the token")
	}
}
