package consulsync

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/safefile"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// envConsulToken is consul-template's token variable. consul/api and the
// consul CLI do not read it, and neither does csisupd: a warning says so
// when it is the only token given.
const envConsulToken = "CONSUL_TOKEN"

// maxDiscoveryWait is the longest wait of a blocking query Consul serves.
const maxDiscoveryWait = 10 * time.Minute

// Config configures a Syncer. It has no defaults: every field that is not
// marked optional must be set (the agent fills them from its validated
// configuration, where all defaults live), and New and Reload reject a
// Config with a field missing or out of range, naming the field.
type Config struct {
	// Plugins is the source of plugins (the registry's plugin.Source).
	// Required.
	Plugins plugin.Source

	// Address of the Consul agent's HTTP API (host:port, or with an
	// http://, https:// or unix:// scheme). Optional: empty means
	// consul/api's own default (CONSUL_HTTP_ADDR, else localhost:8500).
	Address string
	// Token is the ACL token. Optional: empty means consul/api's own
	// default, as the consul CLI reads it (the file named by
	// CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN). It never appears in
	// logs or errors.
	Token string
	// Scheme is "http" or "https". Optional: empty means consul/api's
	// default (CONSUL_HTTP_SSL decides).
	Scheme string
	// TLS configures TLS to Consul. Optional: empty fields take
	// consul/api's defaults (CONSUL_CACERT, CONSUL_CLIENT_CERT, ...).
	TLS api.TLSConfig

	// ServiceName is the Consul service of the agent itself. Required.
	ServiceName string
	// PluginServiceName returns the Consul service name of the plugin with
	// the given ID; distinct IDs must give distinct names. Required.
	PluginServiceName func(pluginID string) string
	// ServerService registers the server role's service (ServerServiceID,
	// named ServerServiceName, on ServicePort), by which servers and agents
	// find the servers (Syncer.Servers).
	ServerService bool
	// ServerServiceName is the service name of the servers, registered with
	// ServerService and watched for Servers. Required.
	ServerServiceName string
	// DiscoveryWait is the wait of the blocking query that watches
	// ServerServiceName in the catalog: while nothing changes the watch
	// makes one request per DiscoveryWait (plus Consul's stagger of up to
	// a sixteenth). At most 10 minutes, the longest wait Consul serves.
	// Required.
	DiscoveryWait time.Duration
	// DiscoveryMinInterval is the shortest time between the starts of two
	// requests of the watch, for a Consul whose index keeps moving.
	// Required.
	DiscoveryMinInterval time.Duration
	// Tags are added to every service.
	Tags []string
	// EnableTagOverride lets tags changed in Consul's catalog survive
	// periodic syncs; a lifecycle change of a service restores csisupd's.
	EnableTagOverride bool
	// DeregisterOnShutdown removes csisupd's services when Run returns.
	DeregisterOnShutdown bool

	// NodeName is this csisupd node's name, recorded in service meta.
	NodeName string
	// ServiceAddress is the address registered for the agent and plugin
	// services. Optional: empty means the Consul node's address.
	ServiceAddress string
	// ServicePort is the agent's gRPC port, registered for the agent and
	// plugin services (plugins are reached through the agent's ClientCSI
	// service). Required.
	ServicePort int
	// GRPCCheck is the address (host:port) Consul's gRPC health check of
	// the agent dials. Required.
	GRPCCheck string
	// GRPCCheckTLS makes the gRPC health check use TLS.
	GRPCCheckTLS bool
	// GRPCCheckTLSServerName is the name Consul verifies in the agent's
	// certificate (and sends as SNI) when GRPCCheckTLS is set. Empty means
	// Consul verifies the address it dials.
	GRPCCheckTLSServerName string
	// GRPCCheckInterval is the time between two gRPC health checks.
	// Required.
	GRPCCheckInterval time.Duration
	// GRPCCheckTimeout bounds one gRPC health check; it must not exceed
	// GRPCCheckInterval. Required.
	GRPCCheckTimeout time.Duration

	// SyncInterval is the time between two periodic passes. A pass also
	// runs on every registry change. Required.
	SyncInterval time.Duration
	// CheckTTL is the TTL of the plugins' health checks. csisupd refreshes
	// a check once per half TTL at most, so a steady-state pass does not
	// write; if csisupd dies without deregistering, the checks turn
	// critical after at most CheckTTL. It must be at least twice
	// SyncInterval.
	CheckTTL time.Duration
	// Probation is how long services with csisupd's ID prefix that this
	// process never wanted are kept after Run starts, so plugins restored
	// after a restart do not flap. Required.
	Probation time.Duration
	// Retry spaces the passes after a failed one: a jittered exponential
	// backoff, reset by a pass that succeeds, so that the agents of a
	// cluster whose Consul restarted do not all retry in one instant.
	// Required: config.DefaultRetry().ConsulSync.
	Retry retry.Policy
	// RequestTimeout bounds one request to Consul. Required.
	RequestTimeout time.Duration
	// ShutdownTimeout bounds the deregistration at shutdown. Required.
	ShutdownTimeout time.Duration

	// Logger receives the sync's log lines. Optional: nil discards them.
	Logger hclog.Logger
	// Metrics receives the csisupd_consul_sync_* series. Optional: nil
	// registers them nowhere. Only New's counts; Reload keeps it.
	Metrics prometheus.Registerer
	// Watchdog tracks the liveness of Run's loop ("consul sync"), which
	// beats on every turn, before every request to Consul and while it
	// waits out a retry backoff, and of the server watch ("consul server
	// watch"). Optional: nil tracks nothing. Only New's counts; Reload
	// keeps it.
	Watchdog *watchdog.Monitor
}

// validate reports every missing or invalid field of c, each naming the
// field, or nil.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("consulsync: "+format, args...))
	}
	positive := func(field string, d time.Duration) bool {
		switch {
		case d < 0:
			bad("%s %s is negative", field, d)
		case d == 0:
			bad("%s is required (greater than zero)", field)
		default:
			return true
		}
		return false
	}

	if c.Plugins == nil {
		bad("Plugins is required")
	}
	if c.ServicePort <= 0 || c.ServicePort > 65535 {
		bad("ServicePort %d is not a port (1-65535)", c.ServicePort)
	}
	if strings.TrimSpace(c.ServiceName) == "" {
		bad("ServiceName is required")
	}
	if c.PluginServiceName == nil {
		bad("PluginServiceName is required")
	} else {
		a, b := c.PluginServiceName("a"), c.PluginServiceName("b")
		switch {
		case strings.TrimSpace(a) == "" || strings.TrimSpace(b) == "":
			bad("PluginServiceName gives a blank service name")
		case a == b:
			bad("PluginServiceName gives plugins a and b the same service name %q", a)
		}
	}
	if strings.TrimSpace(c.ServerServiceName) == "" {
		bad("ServerServiceName is required")
	}
	if positive("DiscoveryWait", c.DiscoveryWait) && c.DiscoveryWait > maxDiscoveryWait {
		bad("DiscoveryWait %s exceeds %s, the longest wait Consul serves", c.DiscoveryWait, maxDiscoveryWait)
	}
	positive("DiscoveryMinInterval", c.DiscoveryMinInterval)
	if ip := net.ParseIP(c.ServiceAddress); ip != nil && ip.IsUnspecified() {
		bad("ServiceAddress %s is unspecified; Consul rejects it as a service address", c.ServiceAddress)
	}
	if c.GRPCCheck == "" {
		bad("GRPCCheck is required")
	} else if host, port, err := net.SplitHostPort(c.GRPCCheck); err != nil {
		bad("GRPCCheck %q is not host:port: %w", c.GRPCCheck, err)
	} else if n, err := strconv.Atoi(port); host == "" || err != nil || n < 1 || n > 65535 {
		bad("GRPCCheck %q needs a host and a port (1-65535)", c.GRPCCheck)
	}
	// Both durations of a pair are checked before the pair itself, so
	// every missing field is reported.
	intervalOK, timeoutOK := positive("GRPCCheckInterval", c.GRPCCheckInterval), positive("GRPCCheckTimeout", c.GRPCCheckTimeout)
	if intervalOK && timeoutOK && c.GRPCCheckTimeout > c.GRPCCheckInterval {
		bad("GRPCCheckTimeout %s exceeds GRPCCheckInterval %s", c.GRPCCheckTimeout, c.GRPCCheckInterval)
	}
	syncOK, ttlOK := positive("SyncInterval", c.SyncInterval), positive("CheckTTL", c.CheckTTL)
	if syncOK && ttlOK && c.CheckTTL < 2*c.SyncInterval {
		bad("CheckTTL %s is shorter than twice SyncInterval %s: checks would expire between passes", c.CheckTTL, c.SyncInterval)
	}
	positive("Probation", c.Probation)
	if err := c.Retry.Validate(); err != nil {
		bad("Retry: %w", err)
	}
	positive("RequestTimeout", c.RequestTimeout)
	positive("ShutdownTimeout", c.ShutdownTimeout)
	for i, t := range c.Tags {
		if strings.TrimSpace(t) == "" {
			bad("Tags element %d is blank", i)
		}
	}
	return errors.Join(errs...)
}

// pluginServiceName returns the Consul service name of a plugin.
func (c Config) pluginServiceName(id string) string {
	return c.PluginServiceName(id)
}

// tokenSource names where the token came from, for logs.
type tokenSource string

const (
	tokenFromConfig tokenSource = "config"
	tokenFromFile   tokenSource = api.HTTPTokenFileEnvName
	tokenFromEnv    tokenSource = api.HTTPTokenEnvName
	tokenNone       tokenSource = "none (anonymous)"
)

// consulClient is one consul/api client with what is needed to redact its
// token and release its connections.
type consulClient struct {
	api       *api.Client
	transport *http.Transport
	token     string
	source    tokenSource
	address   string
}

// newConsulClient builds a consul/api client for c. consul/api's own
// configuration reads the environment as the consul CLI does
// (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE, CONSUL_HTTP_TOKEN,
// CONSUL_HTTP_SSL, CONSUL_CACERT, ...); what c sets wins over it.
//
// The token follows consul/api's precedence: c.Token, else the file named
// by CONSUL_HTTP_TOKEN_FILE (an empty file is skipped, a missing one is an
// error), else CONSUL_HTTP_TOKEN, else none. consul/api tells a configured
// token from the environment's by value: a c.Token equal to
// CONSUL_HTTP_TOKEN counts as that variable, so a CONSUL_HTTP_TOKEN_FILE
// beside both wins; the log line names the source actually used.
func newConsulClient(c Config) (*consulClient, error) {
	ac := api.DefaultConfigWithLogger(c.Logger.Named("consul-api"))
	envToken := ac.Token
	if c.Address != "" {
		ac.Address = c.Address
	}
	if c.Scheme != "" {
		ac.Scheme = c.Scheme
	}
	mergeTLS(&ac.TLSConfig, c.TLS)
	if c.Token != "" {
		ac.Token = c.Token
	}
	if err := checkFiles(ac, envToken); err != nil {
		return nil, fmt.Errorf("consulsync: %w", err)
	}
	tr := ac.Transport
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("consulsync: consul client for %s: %w", ac.Address, redactErr(err, ac.Token))
	}
	// NewClient resolves the token file and the address's scheme into ac.
	token := ac.Token
	source := tokenFromFile
	switch {
	case token == "":
		source = tokenNone
	case c.Token != "" && token == c.Token:
		source = tokenFromConfig
	case token == envToken:
		source = tokenFromEnv
	}
	return &consulClient{api: client, transport: tr, token: token, source: source, address: ac.Address}, nil
}

// maxFileSize caps the token file and the TLS files consul/api reads.
const maxFileSize = 1 << 20

// checkFiles inspects, before consul/api opens them, the files that
// api.NewClient reads for ac: the token file (only when it wins over the
// token ac carries, envToken being CONSUL_HTTP_TOKEN's) and the TLS CA,
// certificate and key files. A FIFO, device, socket or directory in their
// place is refused, naming it (package safefile), where consul/api's open
// would block the agent's start or reload.
func checkFiles(ac *api.Config, envToken string) error {
	type file struct{ what, path string }
	files := []file{
		{"consul TLS CA file", ac.TLSConfig.CAFile},
		{"consul TLS certificate file", ac.TLSConfig.CertFile},
		{"consul TLS key file", ac.TLSConfig.KeyFile},
	}
	if ac.Token == envToken {
		files = append(files, file{api.HTTPTokenFileEnvName, ac.TokenFile})
	}
	var errs []error
	for _, f := range files {
		if f.path != "" {
			errs = append(errs, safefile.Check(f.path, safefile.Spec{What: f.what, MaxSize: maxFileSize}))
		}
	}
	return errors.Join(errs...)
}

func mergeTLS(dst *api.TLSConfig, src api.TLSConfig) {
	set := func(d *string, s string) {
		if s != "" {
			*d = s
		}
	}
	set(&dst.Address, src.Address)
	set(&dst.CAFile, src.CAFile)
	set(&dst.CAPath, src.CAPath)
	set(&dst.CertFile, src.CertFile)
	set(&dst.KeyFile, src.KeyFile)
	if len(src.CAPem) > 0 {
		dst.CAPem = src.CAPem
	}
	if len(src.CertPEM) > 0 {
		dst.CertPEM = src.CertPEM
	}
	if len(src.KeyPEM) > 0 {
		dst.KeyPEM = src.KeyPEM
	}
	if src.InsecureSkipVerify {
		dst.InsecureSkipVerify = true
	}
}

// close releases the client's idle connections.
func (c *consulClient) close() {
	if c != nil && c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}
