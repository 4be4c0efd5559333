// Package tlsutil is csisupd's TLS: certificates that carry a role, TLS
// configurations that follow certificate rotation, a listener that admits
// only peers of one role, and the generation of CAs and certificates for
// `csisupd tls`.
//
// # Roles
//
// A certificate says what its holder is in a DNS SAN, as Nomad's do:
// server.<region>.csisupd for servers, client.<region>.csisupd for node
// agents (RoleName). Any other certificate the CA signed is an operator's
// (RoleCLI); `csisupd tls cert create --cli` makes such certificates with
// the name cli.<region>.csisupd. PeerRole reads the role of a connection
// from the chain crypto/tls verified, never from a certificate that was
// only presented.
//
// # Node names
//
// A client certificate made for one node (`csisupd tls cert create
// --client --node NAME`, CertOptions.NodeName) names it in a URI SAN,
// csisupd://<region>/node/<name> (NodeURI): node names are not always DNS
// names, and a URI SAN can never be read as a role name, nor answer for a
// host name. PeerNodeName reads it from the verified chain of a connection,
// as PeerRole does the role; servers with tls.verify_node_name refuse the
// node calls of a client certificate that names another node, or none.
// Config.NodeName makes New and Reload refuse an agent's own client
// certificate naming another node than the agent's.
//
// # Configurator
//
// A Configurator loads a CA bundle, a certificate and its key from files
// (Config) and loads them again at Reload; a failed reload keeps the
// certificates loaded before. The configurations it returns do not hold
// certificates: IncomingConfig picks the current certificate and CA pool
// in GetConfigForClient at every handshake, and OutgoingConfig presents
// the current certificate through GetClientCertificate and verifies the
// server in VerifyConnection against the current pool, so servers and
// clients built once follow every reload. Open connections keep the
// certificates of their handshake.
//
// Outgoing connections verify the server with crypto/x509 themselves
// (InsecureSkipVerify only hands verification to VerifyConnection):
// crypto/tls would use a RootCAs pool fixed in the configuration, and
// gRPC replaces ServerName with the dialed host, so neither could check a
// rotated CA or a role name. With VerifyServerHostname the server's
// certificate must carry the role name of the peer dialed; a client
// certificate on a server's address is refused.
//
// # Rotating certificates and CAs
//
// A new certificate signed by the same CA: replace cert_file and key_file,
// then call Reload. A new CA: put both CAs in ca_file (a PEM bundle) on
// every agent and reload; then issue the new certificates from the new CA
// and reload each agent; when no certificate of the old CA is left, remove
// it from the bundles and reload. At every step every agent trusts the
// certificates of every other. Reload checks that cert_file was signed by
// a CA of ca_file, so a certificate of the new CA is refused until its
// bundle is in place.
//
// Session tickets are disabled on incoming connections so that every
// connection is verified against the CA pool of its own handshake.
//
// CheckExpiry, run by New and Reload, warns about certificates that expire
// within ExpiryWarning (seven days) or have expired.
//
// # The role-enforcing listener
//
// NewListener wraps a TCP listener (the raft port's): raw connections are
// handshaken in goroutines of their own, each within a timeout and at most
// MaxPending at once, so a peer that connects and says nothing holds up no
// other. Connections that are not TLS, fail verification or carry another
// role than RequireRole are closed and logged with the reason; Accept
// returns the others, handshake done.
//
// # Generating certificates
//
// GenerateCA and GenerateCert use the standard library's crypto only:
// ECDSA P-256 keys (PKCS#8 PEM), random 128-bit serial numbers, and a CA
// whose name constraints permit DNS names in its domain, the role names'
// domain and localhost, as `consul tls ca create` makes them. IP
// addresses are not constrained. WriteFiles writes certificates 0644 and
// keys 0600 and never overwrites a file.
package tlsutil
