package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// ExpiryWarning is how long before a certificate expires CheckExpiry warns.
const ExpiryWarning = 7 * 24 * time.Hour

// Config names the files of a Configurator and how it verifies peers.
type Config struct {
	// CAFile holds the CA certificates peers are verified against (a PEM
	// bundle: during a CA rotation, the old and the new CA). CertFile holds
	// this agent's certificate, followed by any intermediates; KeyFile its
	// private key. All three are required.
	CAFile, CertFile, KeyFile string
	// VerifyIncoming requires and verifies client certificates on incoming
	// connections. Without it a client certificate is verified when one
	// is sent.
	VerifyIncoming bool
	// VerifyOutgoing verifies the peer's chain on outgoing connections.
	VerifyOutgoing bool
	// VerifyServerHostname checks, on outgoing connections to a role, that
	// the peer carries that role's SAN. It implies VerifyOutgoing: a name
	// in a certificate nobody verified proves nothing.
	VerifyServerHostname bool
	// Region is the region of the role names; "" means DefaultRegion.
	Region string
	// NodeName, when set (tls.verify_node_name), is this agent's node
	// name: a client certificate in CertFile must name that node
	// (CertNodeName), and New and Reload refuse one that names another
	// node or none. Server certificates are not checked.
	NodeName string
}

// Configurator builds TLS configurations from a CA, certificate and key
// that it reads from files, and reads again at Reload. The configurations
// it returns read the current certificates at every handshake, so they
// follow a reload without being rebuilt. It is safe for concurrent use.
type Configurator struct {
	cfg    Config
	region string
	logger hclog.Logger

	// reloadMu serialises Reload; handshakes read state without it.
	reloadMu sync.Mutex
	state    atomic.Pointer[tlsState]
}

// tlsState is one loaded set of files; it is never changed once stored.
type tlsState struct {
	cert *tls.Certificate // Leaf set
	pool *x509.CertPool
	cas  []*x509.Certificate
	// chain is the certificates of CertFile: the leaf, then intermediates.
	chain []*x509.Certificate
}

// New loads and checks the files of cfg: the CA bundle parses, the key
// belongs to the certificate, and the certificate was signed by a CA of
// the bundle (directly or through intermediates that follow it in
// CertFile). Errors name the field and file ("tls.cert_file /x/y.pem:
// ..."). It warns about certificates close to expiry (CheckExpiry).
func New(cfg Config, logger hclog.Logger) (*Configurator, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	for _, f := range []struct{ field, file string }{
		{"tls.ca_file", cfg.CAFile}, {"tls.cert_file", cfg.CertFile}, {"tls.key_file", cfg.KeyFile},
	} {
		if f.file == "" {
			return nil, fmt.Errorf("%s: required", f.field)
		}
	}
	if err := CheckRegion(cfg.Region); err != nil {
		return nil, fmt.Errorf("tls region: %w", err)
	}
	if cfg.VerifyServerHostname {
		cfg.VerifyOutgoing = true
	}
	c := &Configurator{cfg: cfg, region: cfg.Region, logger: logger}
	if c.region == "" {
		c.region = DefaultRegion
	}
	st, err := c.load()
	if err != nil {
		return nil, err
	}
	c.state.Store(st)
	c.CheckExpiry(time.Now())
	return c, nil
}

// Reload reads the files again. On any error it keeps the previous
// certificates and returns the error, naming the file. New handshakes use
// the new files; open connections keep theirs.
func (c *Configurator) Reload() error {
	c.reloadMu.Lock()
	defer c.reloadMu.Unlock()
	st, err := c.load()
	if err != nil {
		return err
	}
	c.state.Store(st)
	c.logger.Info("reloaded TLS certificates", "ca_file", c.cfg.CAFile, "cert_file", c.cfg.CertFile,
		"subject", st.cert.Leaf.Subject.String(), "not_after", st.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	c.CheckExpiry(time.Now())
	return nil
}

// Region returns the region of the role names.
func (c *Configurator) Region() string { return c.region }

// Certificate returns the current leaf certificate.
func (c *Configurator) Certificate() *x509.Certificate { return c.state.Load().cert.Leaf }

// load reads and checks the three files.
func (c *Configurator) load() (*tlsState, error) {
	caPEM, err := ReadPEMFile("tls.ca_file", c.cfg.CAFile)
	if err != nil {
		return nil, err
	}
	cas, err := parseCertificates(caPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.ca_file %s: %w", c.cfg.CAFile, err)
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		if !ca.IsCA {
			return nil, fmt.Errorf("tls.ca_file %s: certificate %q is not a CA", c.cfg.CAFile, ca.Subject.String())
		}
		pool.AddCert(ca)
	}
	certPEM, err := ReadPEMFile("tls.cert_file", c.cfg.CertFile)
	if err != nil {
		return nil, err
	}
	chain, err := parseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s: %w", c.cfg.CertFile, err)
	}
	keyPEM, err := ReadPEMFile("tls.key_file", c.cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	if _, err := parsePrivateKey(keyPEM); err != nil {
		return nil, fmt.Errorf("tls.key_file %s: %w", c.cfg.KeyFile, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls.key_file %s: not the key of tls.cert_file %s: %w", c.cfg.KeyFile, c.cfg.CertFile, err)
	}
	if err := signedBy(chain, cas); err != nil {
		return nil, fmt.Errorf("tls.cert_file %s: %w by a CA of tls.ca_file %s", c.cfg.CertFile, err, c.cfg.CAFile)
	}
	cert.Leaf = chain[0]
	if err := c.checkNodeName(cert.Leaf); err != nil {
		return nil, fmt.Errorf("tls.cert_file %s: %w", c.cfg.CertFile, err)
	}
	return &tlsState{cert: &cert, pool: pool, cas: cas, chain: chain}, nil
}

// signedBy checks that chain[0] was signed by one of cas, directly or
// through the intermediates chain[1:]. Only signatures are checked, not
// validity periods: an expired certificate still loads, and CheckExpiry
// reports it.
func signedBy(chain, cas []*x509.Certificate) error {
	cur := chain[0]
	for range chain {
		for _, ca := range cas {
			if cur.CheckSignatureFrom(ca) == nil {
				return nil
			}
		}
		next := -1
		for i, im := range chain[1:] {
			if cur.CheckSignatureFrom(im) == nil {
				next = i + 1
				break
			}
		}
		if next < 0 {
			break
		}
		cur = chain[next]
	}
	return errors.New("not signed")
}

// CheckExpiry warns (logger.Warn, naming the file, subject, not-after and
// days left) about every loaded certificate, CA and own, that expires
// within ExpiryWarning of now or has expired, and returns the same
// messages.
func (c *Configurator) CheckExpiry(now time.Time) []string {
	st := c.state.Load()
	type loaded struct {
		field, file string
		cert        *x509.Certificate
	}
	var all []loaded
	for _, ca := range st.cas {
		all = append(all, loaded{"tls.ca_file", c.cfg.CAFile, ca})
	}
	for _, crt := range st.chain {
		all = append(all, loaded{"tls.cert_file", c.cfg.CertFile, crt})
	}
	var msgs []string
	for _, l := range all {
		left := l.cert.NotAfter.Sub(now)
		if left > ExpiryWarning {
			continue
		}
		notAfter := l.cert.NotAfter.UTC().Format(time.RFC3339)
		subject := l.cert.Subject.String()
		var msg string
		var days int
		if left > 0 {
			days = int(math.Ceil(left.Hours() / 24))
			msg = fmt.Sprintf("%s %s: certificate %q expires at %s (%d days left)", l.field, l.file, subject, notAfter, days)
			c.logger.Warn("TLS certificate expires soon", "file", l.file, "subject", subject, "not_after", notAfter, "days_left", days)
		} else {
			days = -int(math.Floor(-left.Hours() / 24))
			msg = fmt.Sprintf("%s %s: certificate %q expired at %s (%d days ago)", l.field, l.file, subject, notAfter, -days)
			c.logger.Warn("TLS certificate has expired", "file", l.file, "subject", subject, "not_after", notAfter, "days_left", days)
		}
		msgs = append(msgs, msg)
	}
	return msgs
}

// IncomingConfig returns the configuration of a server side: TLS 1.2 or
// newer, and, through GetConfigForClient, the current certificate and CA
// pool at every handshake. Client certificates are required and verified
// with VerifyIncoming, else verified when sent (VerifyClientCertIfGiven);
// crypto/tls verifies them, so the connection's VerifiedChains hold the
// chain that PeerRole reads.
//
// Session tickets are off, so every connection is verified against the
// CA pool of its own handshake: a resumed session would carry the
// verification of an earlier pool. Connections of csisupd are long-lived,
// so full handshakes cost little.
//
// Fields set on the returned configuration itself (NextProtos, say) are
// carried into every handshake's configuration; those set on a clone of
// it are not. gRPC's credentials.NewTLS, which works on a clone, adds its
// ALPN protocol to the configuration of each handshake itself.
func (c *Configurator) IncomingConfig() *tls.Config {
	clientAuth := tls.VerifyClientCertIfGiven
	if c.cfg.VerifyIncoming {
		clientAuth = tls.RequireAndVerifyClientCert
	}
	outer := &tls.Config{
		MinVersion:             tls.VersionTLS12,
		ClientAuth:             clientAuth,
		SessionTicketsDisabled: true,
	}
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		st := c.state.Load()
		inner := outer.Clone()
		inner.GetConfigForClient = nil
		inner.Certificates = []tls.Certificate{*st.cert}
		inner.ClientCAs = st.pool
		return inner, nil
	}
	return outer
}

// OutgoingConfig returns the configuration for dialing a peer of role
// peer: it presents the current certificate (GetClientCertificate),
// verifies the peer's chain against the current CA pool with
// VerifyOutgoing, and with VerifyServerHostname that the peer's
// certificate carries RoleName(peer, region). ServerName is set to that
// name, but the check does not depend on it: gRPC's credentials.NewTLS
// replaces ServerName with the host of the address it dials.
//
// InsecureSkipVerify is set only to defer verification to
// VerifyConnection, which crypto/tls calls on every handshake whatever
// InsecureSkipVerify says: crypto/tls would verify against RootCAs fixed
// when the configuration was made (gRPC clones it once per ClientConn),
// while VerifyConnection verifies with crypto/x509 against the pool loaded
// last, so a rotated CA takes effect without new configurations. Without
// VerifyOutgoing the peer is not verified at all (encryption only).
//
// An empty peer role verifies the chain only: servers call agents so,
// since an agent that also runs the server role presents a server
// certificate, and the agents' addresses come from registrations that
// were themselves authenticated.
func (c *Configurator) OutgoingConfig(peer Role) *tls.Config {
	var name string
	if peer != "" {
		name = RoleName(peer, c.region)
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         name,
		InsecureSkipVerify: true, // verified in VerifyConnection, see above
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.state.Load().cert, nil
		},
	}
	if c.cfg.VerifyOutgoing {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			return c.verifyServer(cs, name)
		}
	}
	return cfg
}

// verifyServer verifies the certificate a server presented against the
// current CA pool and, with VerifyServerHostname, that it carries name.
func (c *Configurator) verifyServer(cs tls.ConnectionState, name string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the server presented no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         c.state.Load().pool,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, im := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(im)
	}
	if c.cfg.VerifyServerHostname && name != "" {
		opts.DNSName = name
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}
