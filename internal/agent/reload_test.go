package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/testutil"
)

// changedKeys sees a change of every configuration field, each as exactly
// one key: a field added to config.Config but not to its String rendering
// would make Reload drop its changes silently.
func TestChangedKeysSeesEveryField(t *testing.T) {
	// The token renders redacted: only a change from none to one shows,
	// so the base has none (a token change is applied live anyway).
	base := config.Default()
	keys, _ := configValues(&base)
	seen := map[string]string{}
	fields := 0
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			name := path + f.Name
			switch {
			case !f.IsExported(), name == "Dev", name == "Warnings", name == "Sources":
				continue // not configuration keys
			case name == "RaftLogLevel":
				continue // no key: dev mode sets it, and dev mode does not change on reload
			case name == "Client.PluginOwnerUIDs", name == "Docker.GroupID":
				continue // derived from client.plugin_owners and docker.group by Validate
			case name == "Plugins":
				continue // a map of blocks: see below
			case f.Type.Kind() == reflect.Struct:
				walk(v.Field(i), name+".")
				continue
			}
			fields++
			next := base
			mutate(t, reflect.ValueOf(&next).Elem().FieldByIndex(indexPath(&base, name)), name)
			got := changedKeys(&base, &next)
			if len(got) != 1 {
				t.Errorf("changing %s changes keys %v, want exactly one", name, got)
				continue
			}
			if other, dup := seen[got[0]]; dup {
				t.Errorf("%s and %s both show as key %s", other, name, got[0])
			}
			seen[got[0]] = name
		}
	}
	walk(reflect.ValueOf(base), "")
	if fields != len(keys) || len(seen) != fields {
		t.Errorf("%d fields, %d keys rendered, %d told apart; want all equal", fields, len(keys), len(seen))
	}

	// A plugin block added, or one of its keys changed, shows too.
	withPlugin := base
	withPlugin.Plugins = map[string]config.PluginConfig{"ebs": {MountDir: "/mnt/ebs"}}
	if got := changedKeys(&base, &withPlugin); !slices.Equal(got, []string{`plugin "ebs".mount_dir`, `plugin "ebs".plugin_mount_dir`,
		`plugin "ebs".socket`, `plugin "ebs".type`, `plugin "ebs".required`, `plugin "ebs".health_timeout`}) {
		t.Errorf("adding a plugin block changes keys %v, want its six keys", got)
	}
	moved := withPlugin
	moved.Plugins = map[string]config.PluginConfig{"ebs": {MountDir: "/srv/ebs"}}
	if got := changedKeys(&withPlugin, &moved); !slices.Equal(got, []string{`plugin "ebs".mount_dir`}) {
		t.Errorf("changing a plugin's mount_dir changes keys %v, want that one", got)
	}
}

// indexPath finds the field index path of a dotted field name.
func indexPath(c *config.Config, name string) []int {
	var idx []int
	typ := reflect.TypeOf(*c)
	for _, part := range strings.Split(name, ".") {
		f, _ := typ.FieldByName(part)
		idx = append(idx, f.Index...)
		typ = f.Type
	}
	return idx
}

// mutate changes a leaf field to another value of its type.
func mutate(t *testing.T, v reflect.Value, name string) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.ValueOf("added")))
	default:
		t.Fatalf("field %s of kind %s: teach mutate", name, v.Kind())
	}
}

// Reload applies what can change live, names every other changed key in
// one warning, refuses a tls change with an error at error level, and
// keeps the running values of what it did not apply, so a later reload
// names them again.
func TestReloadNamesWhatItCannotApply(t *testing.T) {
	dir := testutil.TempDir(t)
	ca := testutil.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "agent", x509.ExtKeyUsageServerAuth)
	cert2, key2 := ca.Issue(t, "agent2", x509.ExtKeyUsageServerAuth)

	tests := []struct {
		name      string
		tls       bool // the agent starts with TLS
		edit      func(c *config.Config)
		wantErr   string   // "" for none
		wantLines []string // log lines, each a substring of one line
		notLogged []string
	}{
		{
			name: "live keys only",
			edit: func(c *config.Config) {
				c.LogLevel = "debug"
				c.Client.ProbeInterval = 2 * time.Second
				c.Client.MaxEventSubscribers = 10
			},
			wantLines: []string{"[INFO]  test: configuration reloaded: log_level=debug"},
			notLogged: []string{"[WARN]", "[ERROR]", "partly"},
		},
		{
			name: "restart-only keys",
			edit: func(c *config.Config) {
				c.Name = "other-node"
				c.Client.RPCTimeout = time.Minute
				c.Client.MaxDestructiveInFlight = 4
				c.LogLevel = "debug"
			},
			wantLines: []string{
				"[WARN]  test: reload: name, client.rpc_timeout, client.max_destructive_in_flight changed but take effect only after a restart",
				"[WARN]  test: configuration partly reloaded",
				"not_applied=\"name, client.rpc_timeout, client.max_destructive_in_flight\"",
			},
			notLogged: []string{"[ERROR]", "configuration reloaded"},
		},
		{
			name:      "one restart-only key",
			edit:      func(c *config.Config) { c.Ports.HTTP++ },
			wantLines: []string{"reload: ports.http changed but takes effect only after a restart"},
		},
		{
			name: "tls added",
			edit: func(c *config.Config) { c.TLS.CAFile, c.TLS.CertFile, c.TLS.KeyFile = ca.File, cert, key },
			wantErr: "tls: changing tls.ca_file, tls.cert_file, tls.key_file by reload is not supported; " +
				"TLS stays as it was (off: the gRPC API serves plain text); restart the agent to change it",
			wantLines: []string{"[ERROR] test: reload: tls: changing tls.ca_file, tls.cert_file, tls.key_file by reload is not supported",
				"configuration partly reloaded"},
			notLogged: []string{"configuration reloaded"},
		},
		{
			name: "tls certificate changed",
			tls:  true,
			edit: func(c *config.Config) { c.TLS.CertFile, c.TLS.KeyFile = cert2, key2 },
			wantErr: "tls: changing tls.cert_file, tls.key_file by reload is not supported; " +
				"TLS stays as it was (on, cert " + cert + ", client CA " + ca.File + "); restart the agent to change it",
		},
		{
			name:      "bad probe timing",
			edit:      func(c *config.Config) { c.Client.ProbeTimeout = 0 },
			wantErr:   "reload probe settings",
			wantLines: []string{"[ERROR] test: reload: reload probe settings"},
			notLogged: []string{"take effect only after a restart", "takes effect only after a restart"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.tls {
				cfg.TLS.CAFile, cfg.TLS.CertFile, cfg.TLS.KeyFile = ca.File, cert, key
			}
			var logs testutil.SyncBuffer
			a, err := New(Config{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Name: "test", Output: &logs})})
			if err != nil {
				t.Fatal(err)
			}
			runAgent(t, a)
			running := *a.cfg

			next := *cfg
			tt.edit(&next)
			err = a.Reload(&next)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Reload: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Reload error = %v, want one containing %q", err, tt.wantErr)
			}
			out := logs.String()
			for _, want := range tt.wantLines {
				if !strings.Contains(out, want) {
					t.Errorf("no log line with %q in:\n%s", want, out)
				}
			}
			for _, not := range tt.notLogged {
				if strings.Contains(out, not) {
					t.Errorf("log has %q:\n%s", not, out)
				}
			}
			// What was not applied keeps its running value.
			if a.cfg.TLS != running.TLS || a.cfg.Name != running.Name || a.cfg.Ports != running.Ports ||
				a.cfg.Client.RPCTimeout != running.Client.RPCTimeout {
				t.Errorf("running configuration took a key that was not applied: %+v", a.cfg)
			}
		})
	}
}

// After a tls change is refused, the API serves exactly as before: plain
// text stays plain text.
func TestReloadRefusedTLSKeepsPlainText(t *testing.T) {
	dir := testutil.TempDir(t)
	ca := testutil.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "agent", x509.ExtKeyUsageServerAuth)
	cfg := testConfig(t)
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	next := *cfg
	next.TLS.CertFile, next.TLS.KeyFile = cert, key
	if err := a.Reload(&next); err == nil {
		t.Fatal("Reload accepted a tls block")
	}
	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := csisupdv1.NewAgentClient(conn).Status(ctx, &csisupdv1.StatusRequest{}); err != nil {
		t.Errorf("plain-text Status after the refused reload: %v", err)
	}
}

// The event stream caps come from the configuration, count per transport
// connection, and change by reload for new streams.
func TestEventStreamCaps(t *testing.T) {
	cfg := testConfig(t)
	cfg.Client.MaxEventSubscribers, cfg.Client.MaxEventSubscribersPerConn = 3, 1
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := csisupdv1.NewAgentClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func() error {
		before, _ := a.agentService.Subscribers()
		s, err := cl.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{Replay: -1})
		if err != nil {
			return err
		}
		// A refused stream ends at once; an accepted one stays open.
		done := make(chan error, 1)
		go func() {
			_, err := s.Recv()
			done <- err
		}()
		testutil.WaitFor(t, 10*time.Second, "the stream to be served or refused", func() bool {
			streams, _ := a.agentService.Subscribers()
			return len(done) > 0 || streams > before
		})
		if len(done) > 0 {
			return <-done
		}
		return nil
	}
	if err := open(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	err = open()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "client.max_event_subscribers_per_connection") {
		t.Fatalf("second stream on one connection: %v, want ResourceExhausted naming client.max_event_subscribers_per_connection", err)
	}
	next := *a.cfg
	next.Client.MaxEventSubscribersPerConn = 3
	if err := a.Reload(&next); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Errorf("second stream after raising the cap by reload: %v", err)
	}
}

// The gRPC server announces its stream limit, drops a client that pings
// too often, and refuses requests over 4 MiB.
func TestServerLimits(t *testing.T) {
	cfg := testConfig(t)
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)

	t.Run("http2", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", a.RPCAddr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			t.Fatal(err)
		}
		fr := http2.NewFramer(c, c)
		if err := fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		// Pings far more often than keepalive.EnforcementPolicy.MinTime.
		for i := range 5 {
			if err := fr.WritePing(false, [8]byte{byte(i)}); err != nil {
				break // the server may close first
			}
		}
		var maxStreams uint32
		var goAway *http2.GoAwayFrame
		for goAway == nil {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("read frame: %v (max streams %d)", err, maxStreams)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
					maxStreams = v
				}
			case *http2.GoAwayFrame:
				goAway = f
			}
		}
		if maxStreams != rpc.MaxConcurrentStreams {
			t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want %d", maxStreams, rpc.MaxConcurrentStreams)
		}
		if goAway.ErrCode != http2.ErrCodeEnhanceYourCalm || !bytes.Contains(goAway.DebugData(), []byte("too_many_pings")) {
			t.Errorf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", goAway.ErrCode, goAway.DebugData())
		}
	})

	t.Run("message size", func(t *testing.T) {
		conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = csisupdv1.NewAgentClient(conn).GetPlugin(ctx, &csisupdv1.GetPluginRequest{Id: strings.Repeat("x", rpc.MaxRecvMsgSize+1)})
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("GetPlugin with a 4 MiB id: %v, want ResourceExhausted", err)
		}
	})
}

// A reload applies the declaration keys of plugin blocks and keeps the
// mount keys as they run; a block that only declared goes with its
// declaration, one with mount keys stays for the restart to change.
func TestApplyDeclarations(t *testing.T) {
	d := config.DefaultPluginHealthTimeout
	running := map[string]config.PluginConfig{
		"mnt":    {MountDir: "/mnt/a", Socket: "/run/a.sock", Type: "node", HealthTimeout: d},
		"decl":   {Socket: "/run/b.sock", Required: true, Type: "node", HealthTimeout: d},
		"stays":  {Socket: "/run/c.sock", HealthTimeout: d},
		"keeper": {PluginMountDir: "/csi", Socket: "/run/k.sock", HealthTimeout: d},
	}
	want := map[string]config.PluginConfig{
		"mnt":   {MountDir: "/mnt/moved", Socket: "/run/a2.sock", Type: "monolith", HealthTimeout: time.Minute},
		"stays": {Socket: "/run/c.sock", HealthTimeout: d},
		"new":   {MountDir: "/mnt/new", Socket: "/run/n.sock", Required: true, Type: "node", HealthTimeout: d},
	}
	got := applyDeclarations(running, want)
	expect := map[string]config.PluginConfig{
		"mnt":    {MountDir: "/mnt/a", Socket: "/run/a2.sock", Type: "monolith", HealthTimeout: time.Minute},
		"stays":  {Socket: "/run/c.sock", HealthTimeout: d},
		"keeper": {PluginMountDir: "/csi", HealthTimeout: d},
		"new":    {Socket: "/run/n.sock", Required: true, Type: "node", HealthTimeout: d},
	}
	if !reflect.DeepEqual(got, expect) {
		t.Errorf("applyDeclarations =\n  %+v\nwant\n  %+v", got, expect)
	}
}
