package consulsync

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
)

// Defaults of Config.
const (
	DefaultServiceName       = "csisupd"
	DefaultPluginServiceName = "csi-plugin-" + PluginIDPlaceholder
	DefaultSyncInterval      = 30 * time.Second
	DefaultCheckTTL          = 10 * time.Minute
	DefaultGRPCCheckInterval = 10 * time.Second
	DefaultGRPCCheckTimeout  = 5 * time.Second
	DefaultProbation         = time.Minute
	DefaultRequestTimeout    = 10 * time.Second
	DefaultShutdownTimeout   = 5 * time.Second
)

// PluginIDPlaceholder is replaced by the plugin ID in
// Config.PluginServiceName.
const PluginIDPlaceholder = "{{id}}"

// Environment variables the token comes from when Config.Token is empty,
// as the consul CLI reads them; envConsulToken belongs to consul-template
// and is deliberately not read.
const (
	envHTTPAddr      = "CONSUL_HTTP_ADDR"
	envHTTPToken     = "CONSUL_HTTP_TOKEN"
	envHTTPTokenFile = "CONSUL_HTTP_TOKEN_FILE"
	envConsulToken   = "CONSUL_TOKEN"
)

// Config configures a Syncer. Zero durations take the defaults above;
// Retry has none here (see its doc).
type Config struct {
	// Registry is the source of plugins. Required.
	Registry *registry.Registry

	// Address of the Consul agent's HTTP API (host:port, or with an
	// http://, https:// or unix:// scheme). Empty means CONSUL_HTTP_ADDR,
	// else consul/api's default (127.0.0.1:8500).
	Address string
	// Token is the ACL token. Empty means CONSUL_HTTP_TOKEN_FILE, else
	// CONSUL_HTTP_TOKEN, as the consul CLI reads them. It never appears in
	// logs or errors.
	Token string
	// Scheme is "http" or "https". Empty means consul/api's default
	// (CONSUL_HTTP_SSL decides).
	Scheme string
	// TLS configures TLS to Consul. Empty fields take consul/api's
	// defaults (CONSUL_CACERT, CONSUL_CLIENT_CERT, ...).
	TLS api.TLSConfig

	// ServiceName is the Consul service of the agent itself (default
	// "csisupd").
	ServiceName string
	// PluginServiceName is the service name of a plugin; PluginIDPlaceholder
	// is replaced by the plugin ID (default "csi-plugin-{{id}}").
	PluginServiceName string
	// ServerService registers the server role's service (ServerServiceID,
	// named ServerServiceName, on ServicePort), by which servers and agents
	// find the servers (Syncer.ServerAddrs).
	ServerService bool
	// ServerServiceName is the service name of the servers, registered with
	// ServerService and looked up by ServerAddrs. Required for either.
	ServerServiceName string
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
	// services. Empty means the Consul node's address.
	ServiceAddress string
	// ServicePort is the agent's gRPC port, registered for the agent and
	// plugin services (plugins are reached through the agent's ClientCSI
	// service). Required.
	ServicePort int
	// GRPCCheck is the address Consul's gRPC health check dials. Empty
	// means ServiceAddress (or 127.0.0.1) and ServicePort.
	GRPCCheck string
	// GRPCCheckTLS makes the gRPC health check use TLS.
	GRPCCheckTLS bool
	// GRPCCheckTLSServerName is the name Consul verifies in the agent's
	// certificate (and sends as SNI) when GRPCCheckTLS is set. Empty means
	// Consul verifies the address it dials.
	GRPCCheckTLSServerName string
	// GRPCCheckInterval is the time between two gRPC health checks.
	GRPCCheckInterval time.Duration

	// SyncInterval is the time between two periodic passes. A pass also
	// runs on every registry change.
	SyncInterval time.Duration
	// CheckTTL is the TTL of the plugins' health checks. csisupd refreshes
	// a check once per half TTL at most, so a steady-state pass does not
	// write; if csisupd dies without deregistering, the checks turn
	// critical after at most CheckTTL. It must be at least twice
	// SyncInterval.
	CheckTTL time.Duration
	// Probation is how long services with csisupd's ID prefix that this
	// process never wanted are kept after Run starts, so plugins restored
	// after a restart do not flap.
	Probation time.Duration
	// Retry spaces the passes after a failed one: a jittered exponential
	// backoff, reset by a pass that succeeds, so that the agents of a
	// cluster whose Consul restarted do not all retry in one instant.
	// Required: config.Retry.ConsulSync.
	Retry retry.Policy
	// RequestTimeout bounds one request to Consul.
	RequestTimeout time.Duration
	// ShutdownTimeout bounds the deregistration at shutdown.
	ShutdownTimeout time.Duration

	// Logger receives the sync's log lines. Optional.
	Logger hclog.Logger
	// Env looks up environment variables (default os.Getenv). consul/api
	// itself also reads the process environment for its defaults.
	Env func(string) string
}

// withDefaults returns c with defaults applied.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.PluginServiceName == "" {
		c.PluginServiceName = DefaultPluginServiceName
	}
	def(&c.GRPCCheckInterval, DefaultGRPCCheckInterval)
	def(&c.SyncInterval, DefaultSyncInterval)
	if c.CheckTTL == 0 {
		c.CheckTTL = max(DefaultCheckTTL, 4*c.SyncInterval)
	}
	def(&c.Probation, DefaultProbation)
	def(&c.RequestTimeout, DefaultRequestTimeout)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.GRPCCheck == "" {
		host := c.ServiceAddress
		if host == "" {
			host = "127.0.0.1"
		}
		c.GRPCCheck = net.JoinHostPort(host, fmt.Sprint(c.ServicePort))
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Env == nil {
		c.Env = os.Getenv
	}
	return c
}

// validate reports the first invalid field of a config with defaults
// applied.
func (c Config) validate() error {
	switch {
	case c.Registry == nil:
		return errors.New("consulsync: Registry is required")
	case c.ServicePort <= 0 || c.ServicePort > 65535:
		return fmt.Errorf("consulsync: ServicePort %d is not a port (1-65535)", c.ServicePort)
	case strings.TrimSpace(c.ServiceName) == "":
		return errors.New("consulsync: ServiceName is blank")
	case strings.TrimSpace(c.pluginServiceName("x")) == "":
		return errors.New("consulsync: PluginServiceName is blank")
	case c.ServerService && strings.TrimSpace(c.ServerServiceName) == "":
		return errors.New("consulsync: ServerServiceName is blank but ServerService is on")
	case c.SyncInterval < 0, c.CheckTTL < 0, c.Probation < 0,
		c.RequestTimeout < 0, c.ShutdownTimeout < 0, c.GRPCCheckInterval < 0:
		return errors.New("consulsync: durations must not be negative")
	case c.CheckTTL < 2*c.SyncInterval:
		return fmt.Errorf("consulsync: CheckTTL %s is shorter than twice SyncInterval %s: checks would expire between passes", c.CheckTTL, c.SyncInterval)
	}
	if err := c.Retry.Validate(); err != nil {
		return fmt.Errorf("consulsync: Retry: %w", err)
	}
	if ip := net.ParseIP(c.ServiceAddress); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("consulsync: ServiceAddress %s is unspecified; Consul rejects it as a service address", c.ServiceAddress)
	}
	for _, t := range c.Tags {
		if strings.TrimSpace(t) == "" {
			return errors.New("consulsync: Tags contains a blank tag")
		}
	}
	return nil
}

// pluginServiceName returns the Consul service name of a plugin.
func (c Config) pluginServiceName(id string) string {
	return strings.ReplaceAll(c.PluginServiceName, PluginIDPlaceholder, id)
}

// tokenSource names where the token came from, for logs.
type tokenSource string

const (
	tokenFromConfig tokenSource = "config"
	tokenFromFile   tokenSource = envHTTPTokenFile
	tokenFromEnv    tokenSource = envHTTPToken
	tokenNone       tokenSource = "none (anonymous)"
)

// resolveToken picks the ACL token with the consul CLI's precedence: the
// configured token, then the file named by CONSUL_HTTP_TOKEN_FILE, then
// CONSUL_HTTP_TOKEN.
func resolveToken(c Config) (string, tokenSource, error) {
	if c.Token != "" {
		return c.Token, tokenFromConfig, nil
	}
	if path := c.Env(envHTTPTokenFile); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return "", "", fmt.Errorf("consulsync: read the token file named by %s: %w", envHTTPTokenFile, err)
		}
		tok := strings.TrimSpace(string(data))
		if tok == "" {
			return "", "", fmt.Errorf("consulsync: token file %s (from %s) is empty", path, envHTTPTokenFile)
		}
		return tok, tokenFromFile, nil
	}
	if tok := c.Env(envHTTPToken); tok != "" {
		return tok, tokenFromEnv, nil
	}
	return "", tokenNone, nil
}

// consulClient is one consul/api client with what is needed to redact its
// token and release its connections.
type consulClient struct {
	api       *api.Client
	transport *http.Transport
	token     string
	source    tokenSource
	address   string
}

// newConsulClient builds a consul/api client for c. consul/api's defaults
// (and the process environment they read) fill everything c leaves empty.
func newConsulClient(c Config) (*consulClient, error) {
	token, source, err := resolveToken(c)
	if err != nil {
		return nil, err
	}
	ac := api.DefaultConfigWithLogger(c.Logger.Named("consul-api"))
	switch {
	case c.Address != "":
		ac.Address = c.Address
	case c.Env(envHTTPAddr) != "":
		ac.Address = c.Env(envHTTPAddr)
	}
	if c.Scheme != "" {
		ac.Scheme = c.Scheme
	}
	mergeTLS(&ac.TLSConfig, c.TLS)
	ac.Token, ac.TokenFile = token, ""
	tr := ac.Transport
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("consulsync: consul client for %s: %w", ac.Address, redactErr(err, token))
	}
	return &consulClient{api: client, transport: tr, token: token, source: source, address: ac.Address}, nil
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
