package config

import "strconv"

// TLSConfig configures TLS of every port: the gRPC APIs and raft. Once
// cert_file and key_file are set, TLS is on and ca_file is required.
type TLSConfig struct {
	// CAFile, CertFile and KeyFile are PEM file paths. CAFile may hold
	// several CA certificates (during a CA rotation).
	CAFile   string
	CertFile string
	KeyFile  string
	// VerifyIncoming requires callers of the gRPC port to present a
	// certificate signed by the CA (the CLI uses a --cli certificate).
	// The raft port always requires a server certificate. Default true.
	VerifyIncoming bool
	// VerifyOutgoing verifies the certificate of every server and agent
	// this process calls against the CA. Default true.
	VerifyOutgoing bool
	// VerifyServerHostname checks that a server called carries the server
	// role name (server.<region>.csisupd) and an agent called the client
	// role name, so that a node's certificate cannot act as a server.
	// Default true.
	VerifyServerHostname bool
	// VerifyNodeName makes servers refuse the node calls of a client
	// certificate that does not name the node the call is for (tls cert
	// create --client --node), and an agent refuse to start with a
	// client certificate naming another node than its name. Needs TLS
	// with verify_incoming. Default false.
	VerifyNodeName bool
}

// ACLConfig configures ACL tokens.
type ACLConfig struct {
	// Enabled turns ACLs on: every API method then needs a token that
	// allows it (or the anonymous policy does). Needs TLS.
	Enabled bool
	// AgentToken is the token the agent presents to the servers
	// (acl.tokens.agent, else CSISUPD_AGENT_TOKEN). Its policy needs
	// node = write.
	AgentToken Secret
}

// Enabled reports whether a certificate and key are configured.
func (t TLSConfig) Enabled() bool {
	return t.CertFile != "" && t.KeyFile != ""
}

// Secret is a string that is never printed: fmt verbs and text or JSON
// encoding show "[redacted]" instead. Use string(s) to read the value.
type Secret string

const redacted = "[redacted]"

// String returns "[redacted]", or "" for an empty secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString returns the redacted form for %#v.
func (s Secret) GoString() string {
	return strconv.Quote(s.String())
}

// MarshalText returns the redacted form, so encoders never see the value.
func (s Secret) MarshalText() ([]byte, error) {
	return []byte(s.String()), nil
}
