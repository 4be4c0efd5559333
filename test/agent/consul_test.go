package agent_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/testutil"
)

// newConsul starts a Consul test agent for one node; agents given the same
// catalog form one datacenter.
func newConsul(t *testing.T, node string, catalog *consultest.Catalog) *consultest.Agent {
	t.Helper()
	c, err := consultest.New(consultest.Config{NodeName: node, Catalog: catalog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Outside dev mode Consul registration is on. With nothing listening on the
// Consul address, a SIGTERM still stops the agent with exit code 0 within
// 5 s, and a warning names the services it could not deregister.
func TestStopWithConsulUnreachable(t *testing.T) {
	dir := testutil.TempDir(t)
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
data_dir = %q
client {
  plugin_dir = %q
}
consul {
  address = %q
}
`, filepath.Join(dir, "data"), filepath.Join(dir, "plugins"), testutil.FreeAddr(t)))
	a := startAgent(t, nil, "--config", cfgFile)

	start := time.Now()
	a.Signal(t, syscall.SIGTERM)
	code := a.Wait(t, 10*time.Second)
	took := time.Since(start)
	if code != 0 {
		t.Errorf("exit code = %d, want 0\n%s", code, a.Stderr)
	}
	if took >= 5*time.Second {
		t.Errorf("stop took %s, want < 5s", took)
	}
	var warning string
	for _, line := range strings.Split(a.Stderr.String(), "\n") {
		if strings.Contains(line, "[WARN]") && strings.Contains(line, "could not deregister") {
			warning = line
		}
	}
	if !strings.Contains(warning, consulsync.AgentServiceID) {
		t.Errorf("no warning naming the services left behind (%s); stderr:\n%s", consulsync.AgentServiceID, a.Stderr)
	}
	if strings.Contains(a.Stderr.String(), "Error:") {
		t.Errorf("a successful stop printed an error:\n%s", a.Stderr)
	}
}

// When an agent is killed, Consul's gRPC check of its own service fails at
// its next run, and every plugin service turns critical with it through its
// alias check: within the check's interval plus its timeout, with no write
// from the dead agent.
func TestKilledAgentTurnsPluginServicesCritical(t *testing.T) {
	const interval = time.Second // Consul's shortest; the check's timeout is min(5s, interval)
	consul := newConsul(t, "node-1", nil)
	dir := testutil.TempDir(t)
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
consul {
  address        = %q
  check_interval = %q
}
`, consul.Addr(), interval))
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	a.waitHealthy(t, "demo")

	pluginSvc := consulsync.PluginServiceID("demo")
	passing := func(id string) bool {
		c, ok := consul.Check(id)
		return ok && c.Status == api.HealthPassing
	}
	testutil.WaitFor(t, 20*time.Second, "the agent's gRPC check and the plugin's checks passing", func() bool {
		return passing(consulsync.GRPCCheckID) && passing(consulsync.PluginCheckID("demo")) &&
			passing(consulsync.AliasCheckID(pluginSvc))
	})

	consul.ResetCounts()
	killed := time.Now()
	a.Signal(t, syscall.SIGKILL)
	a.Wait(t, 10*time.Second)
	bound := 2 * interval // interval plus timeout
	testutil.WaitFor(t, 10*time.Second, "the plugin service critical", func() bool {
		c, ok := consul.Check(consulsync.AliasCheckID(pluginSvc))
		return ok && c.Status == api.HealthCritical
	})
	took := time.Since(killed)
	if took > bound {
		t.Errorf("plugin service turned critical %s after the kill, want within the check interval plus timeout (%s)", took, bound)
	}
	grpcCheck, _ := consul.Check(consulsync.GRPCCheckID)
	t.Logf("plugin service critical %s after SIGKILL; the agent check says %q", took, grpcCheck.Output)
	entries, _, err := consulClient(t, consul).Health().Service("csi-plugin-demo", "", false, nil)
	if err != nil || len(entries) != 1 {
		t.Fatalf("health of csi-plugin-demo: %v (%d entries)", err, len(entries))
	}
	if s := entries[0].Checks.AggregatedStatus(); s != api.HealthCritical {
		t.Errorf("a consumer of /v1/health/service sees the plugin as %s, want critical", s)
	}
	if w := consul.Writes(); w != 0 {
		t.Errorf("%d writes reached Consul after the kill", w)
	}
}

// Three servers with no retry_join find each other in Consul's catalog and
// form through bootstrap_expect = 3; an agent with no client.servers finds
// them the same way and registers its node.
func TestServersAndAgentFindEachOtherThroughConsul(t *testing.T) {
	catalog := consultest.NewCatalog()
	var servers []*agentProc
	for i := range 3 {
		name := fmt.Sprintf("server-%d", i+1)
		consul := newConsul(t, name, catalog)
		dir := testutil.TempDir(t)
		cfgFile := writeFile(t, dir, "server.hcl", fmt.Sprintf(`
name     = %q
data_dir = %q
client {
  enabled = false
}
server {
  enabled          = true
  bootstrap_expect = 3
  raft_multiplier  = 1
}
consul {
  address = %q
}
`, name, filepath.Join(dir, "data"), consul.Addr()))
		servers = append(servers, startAgent(t, nil, "--config", cfgFile))
	}
	testutil.WaitFor(t, 60*time.Second, "three voters and a leader", func() bool {
		r := runCLI(t, "--address", servers[0].addr(), "operator", "raft", "list-peers", "--json")
		var doc struct {
			Peers []struct {
				Suffrage string `json:"suffrage"`
				Leader   bool   `json:"leader"`
			} `json:"peers"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.Stdout), &doc) != nil || len(doc.Peers) != 3 {
			return false
		}
		leaders := 0
		for _, p := range doc.Peers {
			if p.Leader {
				leaders++
			}
		}
		return leaders == 1
	})

	consul := newConsul(t, "client-1", catalog)
	dir := testutil.TempDir(t)
	cfgFile := writeFile(t, dir, "client.hcl", fmt.Sprintf(`
name     = "client-1"
data_dir = %q
client {
  plugin_dir = %q
}
consul {
  address = %q
}
`, filepath.Join(dir, "data"), filepath.Join(dir, "plugins"), consul.Addr()))
	startAgent(t, nil, "--config", cfgFile)
	testutil.WaitFor(t, 30*time.Second, "the client's node registered and ready", func() bool {
		r := runCLI(t, "--address", servers[1].addr(), "node", "status", "--json")
		var doc struct {
			Nodes []struct {
				Name   string `json:"name"`
				Status string `json:"status"`
			} `json:"nodes"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.Stdout), &doc) != nil {
			return false
		}
		for _, n := range doc.Nodes {
			if n.Name == "client-1" && n.Status == "ready" {
				return true
			}
		}
		return false
	})
}

func consulClient(t *testing.T, c *consultest.Agent) *api.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client, err := api.NewClient(&api.Config{Address: c.Addr(), Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return client
}
