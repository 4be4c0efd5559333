package agent

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/testutil"
)

// The agent registers itself and its plugins in Consul with what it really
// listens on, using the configured token, and a SIGHUP reload that fixes a
// wrong token makes the sync succeed without a restart.
func TestAgentRegistersInConsul(t *testing.T) {
	const good, bad = "good-token", "wrong-token"
	consul, err := consultest.New(consultest.Config{ACL: &consultest.ACL{Tokens: map[string]consultest.Policy{
		good: {ServiceWrite: []string{""}, NodeRead: true, AgentRead: true},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)

	cfg := testConfig(t)
	cfg.Consul.Enabled = true
	cfg.Consul.Address = consul.Addr()
	cfg.Consul.Token = bad
	cfg.Client.ProbeInterval, cfg.Client.ProbeTimeout = 200*time.Millisecond, 200*time.Millisecond
	startPlugin(t, cfg, "p1")

	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	waitHealthy(t, a, "p1")
	testutil.WaitFor(t, 10*time.Second, "a denied registration with the wrong token", func() bool {
		return consul.Denied() > 0
	})
	if _, ok := consul.Service(consulsync.AgentServiceID); ok {
		t.Fatal("registered with a token the ACLs deny")
	}

	fixed := *cfg
	fixed.Consul.Token = config.Secret(good)
	if err := a.Reload(&fixed); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "agent and plugin services in Consul", func() bool {
		_, agentOK := consul.Service(consulsync.AgentServiceID)
		_, pluginOK := consul.Service(consulsync.PluginServiceID("p1"))
		return agentOK && pluginOK
	})
	svc, _ := consul.Service(consulsync.AgentServiceID)
	port := a.RPCAddr().(*net.TCPAddr).Port
	if svc.Service != "csisupd" || svc.Port != port {
		t.Errorf("agent service %q on port %d, want csisupd on the agent's rpc port %d", svc.Service, svc.Port, port)
	}
	plugin, _ := consul.Service(consulsync.PluginServiceID("p1"))
	if plugin.Service != "csi-plugin-p1" || plugin.Meta["external-source"] != "csisupd" || plugin.Meta["plugin-id"] == "" {
		t.Errorf("plugin service: %+v", plugin)
	}
	if n := consul.TokensSeen()[good]; n == 0 {
		t.Errorf("the fixed token was never sent: %v", consul.TokensSeen())
	}
}
