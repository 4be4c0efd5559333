package agent

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
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
	// The checks carry the configuration's values: consulsync has no
	// defaults of its own.
	grpcDef, _ := consul.CheckDefinition(consulsync.GRPCCheckID)
	if grpcDef.Interval != cfg.Consul.CheckInterval.String() || grpcDef.Timeout != cfg.Consul.CheckTimeout().String() {
		t.Errorf("gRPC check every %s with timeout %s, want %s and %s",
			grpcDef.Interval, grpcDef.Timeout, cfg.Consul.CheckInterval, cfg.Consul.CheckTimeout())
	}
	if ttlDef, _ := consul.CheckDefinition(consulsync.PluginCheckID("p1")); ttlDef.TTL != cfg.Consul.CheckTTL().String() {
		t.Errorf("plugin check TTL %q, want %q", ttlDef.TTL, cfg.Consul.CheckTTL())
	}
}

// With TLS on the gRPC port, the agent's check is registered with
// GRPCUseTLS and the name in the agent's certificate, so Consul's check of
// a healthy agent passes: here with mutual TLS, Consul presenting a
// certificate of the same CA, as Consul's enable_agent_tls_for_checks does.
func TestAgentConsulCheckUsesTLS(t *testing.T) {
	dir := testutil.TempDir(t)
	ca := testutil.NewCA(t, dir, "ca")
	certFile, keyFile := ca.Issue(t, "client.global.csisupd", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	consulCert, consulKey := ca.Issue(t, "consul.test", x509.ExtKeyUsageClientAuth)
	consulPair, err := tls.LoadX509KeyPair(consulCert, consulKey)
	if err != nil {
		t.Fatal(err)
	}
	consul, err := consultest.New(consultest.Config{
		CheckTLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{consulPair}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)

	cfg := testConfig(t)
	cfg.TLS = config.TLSConfig{CAFile: ca.File, CertFile: certFile, KeyFile: keyFile}
	cfg.Consul.Enabled = true
	cfg.Consul.Address = consul.Addr()
	cfg.Consul.CheckInterval = time.Second
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)

	testutil.WaitFor(t, 10*time.Second, "Consul's TLS gRPC check of the agent passing", func() bool {
		c, ok := consul.Check(consulsync.GRPCCheckID)
		return ok && c.Status == api.HealthPassing
	})
	def, ok := consul.CheckDefinition(consulsync.GRPCCheckID)
	if !ok || !def.GRPCUseTLS || def.TLSServerName != "client.global.csisupd" {
		t.Errorf("registered check: GRPCUseTLS %v, TLSServerName %q; want true and the certificate's name", def.GRPCUseTLS, def.TLSServerName)
	}
	if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(a.RPCAddr().(*net.TCPAddr).Port)); def.GRPC != want {
		t.Errorf("check dials %q, want %q", def.GRPC, want)
	}
}

// An agent that finds its servers in Consul's catalog, while none is
// registered, asks the catalog once per consul.discovery_wait through one
// blocking query, however often the node client looks for servers.
func TestAgentWithoutServersWatchesTheCatalog(t *testing.T) {
	consul, err := consultest.New(consultest.Config{ManualChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)
	cfg := testConfig(t)
	cfg.Consul.Enabled, cfg.Consul.Address = true, consul.Addr()
	cfg.Consul.ClientAutoJoin = true // and no client.servers
	const wait, window = 2 * time.Second, 6 * time.Second
	cfg.Consul.DiscoveryWait = wait
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	testutil.WaitFor(t, 10*time.Second, "the watch's first request", func() bool {
		return consul.Count(consultest.RouteCatalogService) > 0
	})
	consul.ResetCounts()
	period := time.NewTimer(window)
	<-period.C // the measurement period, not a synchronisation
	if got, limit := consul.Count(consultest.RouteCatalogService), int(window/wait)+1; got > limit {
		t.Errorf("%d catalog requests in %s with discovery_wait %s, want at most %d", got, window, wait, limit)
	}
}
