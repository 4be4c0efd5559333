package consultest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// healthServer is a real gRPC server with the standard health service.
type healthServer struct {
	addr   string
	health *health.Server
	srv    *grpc.Server
	done   chan struct{}
}

// startHealthServer serves the gRPC health service on 127.0.0.1:0, with
// TLS when cert is set. It is stopped when the test ends.
func startHealthServer(t *testing.T, cert *tls.Certificate) *healthServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if cert != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{*cert}})))
	}
	s := &healthServer{addr: l.Addr().String(), health: health.NewServer(), srv: grpc.NewServer(opts...), done: make(chan struct{})}
	healthpb.RegisterHealthServer(s.srv, s.health)
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(l)
	}()
	t.Cleanup(s.stop)
	return s
}

// stop stops the server and waits for Serve to return.
func (s *healthServer) stop() {
	s.srv.Stop()
	<-s.done
}

// registerGRPC registers service s with one gRPC check.
func registerGRPC(t *testing.T, c *api.Client, chk api.AgentServiceCheck) {
	t.Helper()
	chk.CheckID = "g"
	if chk.Interval == "" {
		chk.Interval = "50ms"
	}
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Check: &chk}); err != nil {
		t.Fatal(err)
	}
}

func passing(chk api.AgentCheck) bool  { return chk.Status == api.HealthPassing }
func critical(chk api.AgentCheck) bool { return chk.Status == api.HealthCritical && chk.Output != "" }

func TestGRPCCheckRuns(t *testing.T) {
	tests := []struct {
		name string
		// service is appended to the target after a slash when set.
		service string
		// serving sets the health of the probed service before the check
		// registers.
		serving healthpb.HealthCheckResponse_ServingStatus
		// fail makes the check fail after it passed.
		fail       func(s *healthServer)
		wantOutput []string // substrings of the critical output; %t is the target
	}{
		{"server stops", "", healthpb.HealthCheckResponse_SERVING, (*healthServer).stop, []string{"gRPC check %t: ", "Unavailable"}},
		{"server not serving", "", healthpb.HealthCheckResponse_SERVING, func(s *healthServer) {
			s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		}, []string{"gRPC %t serving status: NOT_SERVING"}},
		{"named service", "csi", healthpb.HealthCheckResponse_SERVING, func(s *healthServer) {
			s.health.SetServingStatus("csi", healthpb.HealthCheckResponse_NOT_SERVING)
		}, []string{"gRPC %t serving status: NOT_SERVING"}},
		{"unknown service", "nope", healthpb.HealthCheckResponse_UNKNOWN, nil, []string{"gRPC check %t: ", "NotFound"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startHealthServer(t, nil)
			if tt.service != "" && tt.serving != healthpb.HealthCheckResponse_UNKNOWN {
				s.health.SetServingStatus(tt.service, tt.serving)
			}
			target := s.addr
			if tt.service != "" {
				target += "/" + tt.service
			}
			a := newAgent(t, Config{})
			c := newClient(t, a, "")
			registerGRPC(t, c, api.AgentServiceCheck{GRPC: target, Interval: "50ms", Timeout: "2s"})
			if tt.fail != nil {
				chk := waitCheck(t, a, "g", "passing", passing)
				if want := "gRPC check " + target + ": success"; chk.Output != want {
					t.Errorf("passing output = %q, want %q", chk.Output, want)
				}
				// The result reached the catalog at once.
				entries, _, err := c.Health().Service("s", "", true, nil)
				if err != nil || len(entries) != 1 {
					t.Fatalf("passing health entries = %d, %v; want 1", len(entries), err)
				}
				tt.fail(s)
			}
			chk := waitCheck(t, a, "g", "critical", critical)
			for _, w := range tt.wantOutput {
				if w = strings.ReplaceAll(w, "%t", target); !strings.Contains(chk.Output, w) {
					t.Errorf("critical output %q does not contain %q", chk.Output, w)
				}
			}
			waitFor(t, a, "the catalog to show the critical check", func() bool {
				entries, _, err := c.Health().Service("s", "", true, nil)
				return err == nil && len(entries) == 0
			})
		})
	}
}

// testPKI is a CA and a server certificate for "server.test" it signed.
type testPKI struct {
	roots  *x509.CertPool
	server tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "consultest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "server.test"},
		DNSNames:     []string{"server.test"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return testPKI{roots: roots, server: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}
}

func TestGRPCCheckTLS(t *testing.T) {
	pki := newTestPKI(t)
	s := startHealthServer(t, &pki.server)
	withRoots := &tls.Config{RootCAs: pki.roots}
	tests := []struct {
		name       string
		checkTLS   *tls.Config
		check      api.AgentServiceCheck
		wantStatus string
		wantOutput string // substring
	}{
		{"server name and CA", withRoots, api.AgentServiceCheck{GRPCUseTLS: true, TLSServerName: "server.test"}, api.HealthPassing, "success"},
		{"wrong server name", withRoots, api.AgentServiceCheck{GRPCUseTLS: true, TLSServerName: "wrong.test"}, api.HealthCritical, "wrong.test"},
		{"IP as server name", withRoots, api.AgentServiceCheck{GRPCUseTLS: true}, api.HealthCritical, "127.0.0.1"},
		{"system roots", nil, api.AgentServiceCheck{GRPCUseTLS: true, TLSServerName: "server.test"}, api.HealthCritical, "certificate"},
		{"skip verify", nil, api.AgentServiceCheck{GRPCUseTLS: true, TLSServerName: "wrong.test", TLSSkipVerify: true}, api.HealthPassing, "success"},
		{"plaintext to a TLS server", withRoots, api.AgentServiceCheck{}, api.HealthCritical, "Unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{CheckTLS: tt.checkTLS})
			chk := tt.check
			chk.GRPC, chk.Timeout = s.addr, "2s"
			registerGRPC(t, newClient(t, a, ""), chk)
			got := waitCheck(t, a, "g", tt.wantStatus, func(c api.AgentCheck) bool { return c.Output != "" })
			if got.Status != tt.wantStatus || !strings.Contains(got.Output, tt.wantOutput) {
				t.Errorf("check = %s %q, want %s containing %q", got.Status, got.Output, tt.wantStatus, tt.wantOutput)
			}
		})
	}
	if withRoots.ServerName != "" || withRoots.InsecureSkipVerify {
		t.Error("a check changed Config.CheckTLS instead of a clone")
	}
}

func TestGRPCCheckRunnerLifecycle(t *testing.T) {
	s := startHealthServer(t, nil)
	tests := []struct {
		name string
		// stop ends the runner of check g.
		stop func(t *testing.T, a *Agent, c *api.Client)
	}{
		{"check deregistered", func(t *testing.T, a *Agent, c *api.Client) {
			if err := c.Agent().CheckDeregister("g"); err != nil {
				t.Fatal(err)
			}
		}},
		{"service deregistered", func(t *testing.T, a *Agent, c *api.Client) {
			if err := c.Agent().ServiceDeregister("s"); err != nil {
				t.Fatal(err)
			}
		}},
		{"check re-registered", func(t *testing.T, a *Agent, c *api.Client) {
			registerGRPC(t, c, api.AgentServiceCheck{GRPC: s.addr, Interval: "60ms"})
			if r := runnerOf(a, "g"); r == nil {
				t.Error("re-registered check has no runner")
			}
		}},
		{"replaced by a TTL check", func(t *testing.T, a *Agent, c *api.Client) {
			err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Check: &api.AgentServiceCheck{CheckID: "g", TTL: "1m"}})
			if err != nil {
				t.Fatal(err)
			}
			if chk, _ := a.Check("g"); chk.Type != "ttl" || chk.Status != api.HealthPassing {
				t.Errorf("replaced check = %+v, want a ttl check that kept the passing status", chk)
			}
		}},
		{"agent closed", func(t *testing.T, a *Agent, c *api.Client) { a.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{})
			c := newClient(t, a, "")
			registerGRPC(t, c, api.AgentServiceCheck{GRPC: s.addr})
			waitCheck(t, a, "g", "passing", passing)
			r := runnerOf(a, "g")
			if r == nil {
				t.Fatal("gRPC check has no runner")
			}
			tt.stop(t, a, c)
			waitDone(t, r)
		})
	}

	t.Run("manual checks", func(t *testing.T) {
		a := newAgent(t, Config{ManualChecks: true})
		c := newClient(t, a, "")
		registerGRPC(t, c, api.AgentServiceCheck{GRPC: s.addr})
		if runnerOf(a, "g") != nil {
			t.Fatal("a gRPC check runs with ManualChecks")
		}
		if chk, _ := a.Check("g"); chk.Status != api.HealthCritical || chk.Output != "" {
			t.Fatalf("manual check = %+v, want critical without output", chk)
		}
		if err := a.SetCheckStatus("g", api.HealthPassing, "set"); err != nil {
			t.Fatal(err)
		}
		entries, _, err := c.Health().Service("s", "", true, nil)
		if err != nil || len(entries) != 1 {
			t.Fatalf("health after SetCheckStatus = %d, %v; want 1 passing entry", len(entries), err)
		}
	})

	t.Run("concurrent probes and writes", func(t *testing.T) {
		a := newAgent(t, Config{})
		c := newClient(t, a, "")
		registerGRPC(t, c, api.AgentServiceCheck{GRPC: s.addr, Interval: "1ms"})
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				for j := range 20 {
					var err error
					if i%2 == 0 {
						_, err = c.Agent().Checks()
					} else {
						err = c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Check: &api.AgentServiceCheck{
							CheckID: "g", GRPC: s.addr, Interval: "1ms", Notes: string(rune('a' + j)),
						}})
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		waitCheck(t, a, "g", "passing", passing)
	})
}

func TestAliasCheck(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	a := newAgent(t, Config{NodeName: "n1", Now: clock, ManualChecks: true})
	c := newClient(t, a, "")
	ag := c.Agent()
	register := func(t *testing.T) {
		t.Helper()
		err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "web", Name: "web", Checks: api.AgentServiceChecks{
			{CheckID: "web:ttl", Name: "web ttl", TTL: "1m", Status: api.HealthPassing},
			{CheckID: "web:grpc", Name: "web grpc", GRPC: "127.0.0.1:1", Interval: "10s", Status: api.HealthPassing},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	register(t)
	err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "side", Name: "side"})
	if err != nil {
		t.Fatal(err)
	}
	// An alias check needs no interval.
	err = ag.CheckRegister(&api.AgentCheckRegistration{ID: "alias", Name: "alias", ServiceID: "side", AgentServiceCheck: api.AgentServiceCheck{AliasService: "web"}})
	if err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name       string
		do         func(t *testing.T)
		wantStatus string
		wantOutput string
	}{
		{"all passing", func(t *testing.T) {}, api.HealthPassing, "All checks passing."},
		{"TTL check critical", func(t *testing.T) {
			if err := ag.UpdateTTL("web:ttl", "down", api.HealthCritical); err != nil {
				t.Fatal(err)
			}
		}, api.HealthCritical, `Aliased check "web ttl" failing: down`},
		{"TTL check passing again", func(t *testing.T) {
			if err := ag.UpdateTTL("web:ttl", "up", api.HealthPassing); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "All checks passing."},
		{"gRPC check warning", func(t *testing.T) {
			if err := a.SetCheckStatus("web:grpc", api.HealthWarning, "slow"); err != nil {
				t.Fatal(err)
			}
		}, api.HealthWarning, `Aliased check "web grpc" failing: slow`},
		{"gRPC check critical", func(t *testing.T) {
			if err := a.SetCheckStatus("web:grpc", api.HealthCritical, "refused"); err != nil {
				t.Fatal(err)
			}
		}, api.HealthCritical, `Aliased check "web grpc" failing: refused`},
		{"gRPC check passing", func(t *testing.T) {
			if err := a.SetCheckStatus("web:grpc", api.HealthPassing, "ok"); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "All checks passing."},
		{"TTL expiry", func(t *testing.T) { advance(2 * time.Minute) }, api.HealthCritical, `Aliased check "web ttl" failing: TTL expired (last output before timeout follows): up`},
		{"TTL revived", func(t *testing.T) {
			if err := ag.UpdateTTL("web:ttl", "", api.HealthPassing); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "All checks passing."},
		{"node check critical", func(t *testing.T) {
			err := ag.CheckRegister(&api.AgentCheckRegistration{ID: "node", Name: "node check", AgentServiceCheck: api.AgentServiceCheck{TTL: "1h"}})
			if err != nil {
				t.Fatal(err)
			}
		}, api.HealthCritical, `Aliased check "node check" failing: `},
		{"node check deregistered", func(t *testing.T) {
			if err := ag.CheckDeregister("node"); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "All checks passing."},
		{"aliased service deregistered", func(t *testing.T) {
			if err := ag.ServiceDeregister("web"); err != nil {
				t.Fatal(err)
			}
		}, api.HealthCritical, "Service web could not be found on node n1"},
		{"aliased service without checks", func(t *testing.T) {
			if err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "web", Name: "web"}); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "No checks found."},
		{"aliased service back with checks", register, api.HealthPassing, "All checks passing."},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do(t)
			// Alias checks are evaluated synchronously: the state is final
			// as soon as the change is made.
			chk, ok := a.Check("alias")
			if !ok || chk.Status != st.wantStatus || chk.Output != st.wantOutput || chk.Type != "alias" {
				t.Fatalf("alias = %+v, want %s %q", chk, st.wantStatus, st.wantOutput)
			}
			entries, _, err := c.Health().Service("side", "", false, nil)
			if err != nil || len(entries) != 1 {
				t.Fatalf("health of side = %v, %v", entries, err)
			}
			var got *api.HealthCheck
			for _, h := range entries[0].Checks {
				if h.CheckID == "alias" {
					got = h
				}
			}
			if got == nil || got.Status != st.wantStatus || got.Output != st.wantOutput {
				t.Errorf("catalog alias = %+v, want %s %q", got, st.wantStatus, st.wantOutput)
			}
		})
	}
}

func TestTTLTimerExpiresWithoutRequests(t *testing.T) {
	a := newAgent(t, Config{NodeName: "n1"})
	c := newClient(t, a, "")
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{
		{CheckID: "t", TTL: "50ms", Status: api.HealthPassing},
		{CheckID: "alias", AliasService: "s", Name: "alias"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Agent().UpdateTTL("t", "alive", api.HealthPassing); err != nil {
		t.Fatal(err)
	}
	// Only the agent's own TTL timer can close Changed now: no request
	// and no accessor runs until it does.
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		ch := a.Changed()
		a.cat.mu.Lock()
		n := a.cat.nodes["n1"]
		got := *n.checks["t"]
		alias := *n.checks["alias"]
		a.cat.mu.Unlock()
		if got.Status == api.HealthCritical {
			if want := "TTL expired (last output before timeout follows): alive"; got.Output != want {
				t.Errorf("catalog output = %q, want %q", got.Output, want)
			}
			if alias.Status != api.HealthCritical {
				t.Errorf("catalog alias = %s %q, want critical", alias.Status, alias.Output)
			}
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatal("the TTL check did not expire in the catalog")
		}
	}
}

func TestStatusHandlerThresholds(t *testing.T) {
	const p, c = api.HealthPassing, api.HealthCritical
	tests := []struct {
		name                                  string
		successBefore, warnBefore, critBefore int
		results                               []string
		want                                  []string // recorded status per result, "" for none
	}{
		{"no thresholds", 0, 0, 0, []string{p, c, p}, []string{p, c, p}},
		{"first result applies at once", 2, 0, 2, []string{c, p}, []string{c, ""}},
		{"success before passing", 2, 0, 0, []string{c, p, p, p}, []string{c, "", p, p}},
		{"failures before critical", 0, 0, 3, []string{p, c, c, c}, []string{p, "", "", c}},
		{"failures before warning", 0, 1, 3, []string{p, c, c, c}, []string{p, api.HealthWarning, api.HealthWarning, c}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newStatusHandler(tt.successBefore, tt.warnBefore, tt.critBefore)
			for i, r := range tt.results {
				got, _, ok := h.update(r, "out")
				if !ok {
					got = ""
				}
				if got != tt.want[i] {
					t.Errorf("result %d (%s): recorded %q, want %q", i, r, got, tt.want[i])
				}
			}
		})
	}
}
