package csisupdv1

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultAddress is the agent's default gRPC address.
const DefaultAddress = "127.0.0.1:4780"

// ClientConfig configures Dial.
type ClientConfig struct {
	// Address is the agent's gRPC address: host:port, or unix:///path for a
	// unix socket. Empty means DefaultAddress.
	Address string
	// TLS secures the connection when not nil. TLSFiles.ClientConfig builds
	// one from PEM files.
	TLS *tls.Config
	// Token is the ACL secret id sent with every call (in the
	// TokenMetadataKey metadata) when not empty. It is sent only over TLS.
	Token string
	// DialOptions are appended to the defaults.
	DialOptions []grpc.DialOption
}

// TokenMetadataKey is the gRPC metadata key that carries an ACL token's
// secret id.
const TokenMetadataKey = "csisupd-token"

// NodeSecretMetadataKey is the gRPC metadata key that carries an agent's
// node secret on its calls of the Cluster service.
const NodeSecretMetadataKey = "csisupd-node-secret"

// TokenCredentials sends an ACL token with every call of a connection:
// use it with grpc.WithPerRPCCredentials. It refuses to send the token over
// a connection without TLS, where anyone on the path could read it;
// InsecureToken allows that for tests on loopback.
type TokenCredentials struct {
	// Secret is the token's secret id. Empty sends nothing.
	Secret string
	// InsecureToken sends the token over connections without TLS too.
	InsecureToken bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t TokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if t.Secret == "" {
		return nil, nil
	}
	return map[string]string{TokenMetadataKey: t.Secret}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (t TokenCredentials) RequireTransportSecurity() bool { return !t.InsecureToken }

// String hides the secret from logs and %v.
func (t TokenCredentials) String() string { return "csisupd token [redacted]" }

// Client is a connection to one csisupd agent with its service clients.
// Errors from ClientCSI carry typed details: check them with IsRetryable,
// IsIgnorable, IsPluginNotFound and ErrorDetail.
type Client struct {
	conn *grpc.ClientConn

	// ClientCSI calls the controller service of the agent's plugins.
	ClientCSI ClientCSIClient
	// Agent reports the agent's plugins and events.
	Agent AgentClient
}

// Dial creates a client for the agent at cfg.Address. It does not connect:
// the first call does, and an unreachable agent fails that call with
// Unavailable, marked so that NotReached tells it from an Unavailable
// answer.
func Dial(cfg ClientConfig) (*Client, error) {
	addr := cfg.Address
	if addr == "" {
		addr = DefaultAddress
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, NotReachedInterceptors()...)
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(TokenCredentials{Secret: cfg.Token}))
	}
	opts = append(opts, cfg.DialOptions...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("csisupd: agent address %q: %w", addr, err)
	}
	return &Client{
		conn:      conn,
		ClientCSI: NewClientCSIClient(conn),
		Agent:     NewAgentClient(conn),
	}, nil
}

// Conn returns the underlying connection, for other services or state
// watching.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection. Pending calls fail with Canceled.
func (c *Client) Close() error { return c.conn.Close() }

// TLSFiles names the PEM files of a TLS client.
type TLSFiles struct {
	// CAFile holds the certificates that sign the agent's certificate. Empty
	// means the system's roots.
	CAFile string
	// CertFile and KeyFile hold the client's certificate and key, for agents
	// that require client certificates. Set both or neither.
	CertFile string
	KeyFile  string
	// ServerName overrides the name checked in the agent's certificate
	// (default: the host of the dialed address).
	ServerName string
}

// ClientConfig loads the files into a TLS client configuration. Errors name
// the file that could not be used.
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pool, err := LoadCertPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("csisupd: tls cert_file %q / key_file %q: %w", f.CertFile, f.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, errors.New("csisupd: tls cert_file and key_file must be set together")
	}
	return cfg, nil
}

// LoadCertPool reads PEM certificates from file into a new pool.
func LoadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("csisupd: tls ca_file %q: %w", file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("csisupd: tls ca_file %q: no PEM certificate found", file)
	}
	return pool, nil
}
