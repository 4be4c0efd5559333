package tlsutil

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Defaults of certificate generation.
const (
	// DefaultCADays is how long a CA is valid: five years.
	DefaultCADays = 1825
	// DefaultCertDays is how long a leaf certificate is valid: one year.
	DefaultCertDays = 365
	// DefaultDomain is the DNS domain a CA's name constraints permit.
	DefaultDomain = roleDomain
)

// backdate is how long before its creation a certificate is valid, so that
// a machine whose clock is slightly behind accepts it at once.
const backdate = time.Minute

// CAOptions configures GenerateCA.
type CAOptions struct {
	// Days is how long the CA is valid; 0 means DefaultCADays.
	Days int
	// Domain is the DNS domain the CA may sign names in; "" means
	// DefaultDomain. The role names' domain ("csisupd") and localhost are
	// always permitted, so that the CA can sign role certificates whatever
	// the domain is.
	Domain string
	// AdditionalConstraints are further DNS domains the CA may sign names
	// in, for additional names of certificates outside Domain.
	AdditionalConstraints []string
	// CommonName is the CA's subject; "" means "csisupd Agent CA <random>".
	CommonName string
}

// GenerateCA creates a self-signed CA: an ECDSA P-256 key, a random 128-bit
// serial number, and name constraints (critical) that permit DNS names in
// the domain, the role names' domain and localhost only, as `consul tls ca
// create` does. IP addresses are not constrained, so leaves may carry any
// IP SAN (127.0.0.1 among them). It returns the certificate and the
// PKCS#8 key, both PEM.
func GenerateCA(opts CAOptions) (certPEM, keyPEM []byte, err error) {
	if opts.Days < 0 {
		return nil, nil, fmt.Errorf("CA validity %d days: must be positive", opts.Days)
	}
	days := cmp.Or(opts.Days, DefaultCADays)
	domain := strings.TrimSuffix(cmp.Or(opts.Domain, DefaultDomain), ".")
	permitted := []string{domain}
	for _, d := range append([]string{roleDomain, "localhost"}, opts.AdditionalConstraints...) {
		d = strings.TrimSuffix(d, ".")
		if d == "" {
			return nil, nil, errors.New("CA name constraint: empty domain")
		}
		if !slices.Contains(permitted, d) {
			permitted = append(permitted, d)
		}
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	cn := opts.CommonName
	if cn == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		cn = fmt.Sprintf("csisupd Agent CA %d", binary.BigEndian.Uint32(b[:]))
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{CommonName: cn},
		NotBefore:                   now.Add(-backdate),
		NotAfter:                    now.AddDate(0, 0, days),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// CertOptions configures GenerateCert.
type CertOptions struct {
	// CACertPEM and CAKeyPEM are the signing CA, as GenerateCA returns
	// them (the key may also be an "EC PRIVATE KEY").
	CACertPEM, CAKeyPEM []byte
	// Role is the certificate's role; Region its region, "" meaning
	// DefaultRegion.
	Role   Role
	Region string
	// Days is how long the certificate is valid; 0 means DefaultCertDays.
	Days int
	// DNSNames and IPAddresses are SANs in addition to the defaults.
	DNSNames    []string
	IPAddresses []net.IP
	// NodeName, for a client certificate only, is the node the certificate
	// is for: it is put in a URI SAN, NodeURI(Region, NodeName), and the
	// servers read it with PeerNodeName when tls.verify_node_name is on.
	NodeName string
}

// GenerateCert creates a certificate of a role signed by the CA: an ECDSA
// P-256 key and a random 128-bit serial number. Server and client
// certificates carry the SANs RoleName(role, region), localhost and
// 127.0.0.1 (and a client certificate made for a node NodeURI(region,
// node)) and may authenticate servers and clients (ExtKeyUsage
// ServerAuth and ClientAuth); CLI certificates carry RoleName(RoleCLI,
// region) and localhost and authenticate clients only. The additional
// names follow. The certificate is checked against the CA before it is
// returned, so that a name the CA's constraints forbid is an error here
// rather than at every handshake. It returns the certificate and the
// PKCS#8 key, both PEM.
func GenerateCert(opts CertOptions) (certPEM, keyPEM []byte, err error) {
	if err := checkRole(opts.Role); err != nil {
		return nil, nil, err
	}
	if err := CheckRegion(opts.Region); err != nil {
		return nil, nil, err
	}
	if opts.Days < 0 {
		return nil, nil, fmt.Errorf("certificate validity %d days: must be positive", opts.Days)
	}
	if err := checkNodeCert(opts); err != nil {
		return nil, nil, err
	}
	ca, caKey, err := parseCA(opts.CACertPEM, opts.CAKeyPEM)
	if err != nil {
		return nil, nil, err
	}
	name := RoleName(opts.Role, opts.Region)
	dnsNames := []string{name, "localhost"}
	for _, n := range opts.DNSNames {
		if n == "" {
			return nil, nil, errors.New("additional DNS name: empty")
		}
		if !hasName(dnsNames, n) {
			dnsNames = append(dnsNames, n)
		}
	}
	var ips []net.IP
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if opts.Role != RoleCLI {
		ips = append(ips, net.IPv4(127, 0, 0, 1))
		usage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	for _, ip := range opts.IPAddresses {
		if ip == nil {
			return nil, nil, errors.New("additional IP address: empty")
		}
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.AddDate(0, 0, cmp.Or(opts.Days, DefaultCertDays)),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           usage,
		DNSNames:              dnsNames,
		IPAddresses:           ips,
	}
	if opts.NodeName != "" {
		tmpl.URIs = []*url.URL{NodeURI(opts.Region, opts.NodeName)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate %s: %w", name, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, nil, fmt.Errorf("certificate %s does not verify against the CA %q: %w", name, ca.Subject.CommonName, err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// parseCA returns the first certificate of certPEM and the key of keyPEM,
// checking that the certificate is a CA and the key is its own.
func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, crypto.Signer, error) {
	certs, err := parseCertificates(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	ca := certs[0]
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("CA certificate %q: not a CA", ca.Subject.CommonName)
	}
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(ca.PublicKey) {
		return nil, nil, fmt.Errorf("CA key: not the key of the CA certificate %q", ca.Subject.CommonName)
	}
	return ca, key, nil
}

// parseCertificates returns every CERTIFICATE block of a PEM file, in
// order; other blocks are skipped. It fails when there is none.
func parseCertificates(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE found")
	}
	return certs, nil
}

// parsePrivateKey returns the first private key of a PEM file: PKCS#8
// ("PRIVATE KEY"), SEC 1 ("EC PRIVATE KEY") or PKCS#1 ("RSA PRIVATE KEY").
func parsePrivateKey(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no PEM private key found")
		}
		var key any
		var err error
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", block.Type, err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: a %T cannot sign", block.Type, key)
		}
		return signer, nil
	}
}

// encodeKey returns key as a PKCS#8 "PRIVATE KEY" PEM block.
func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// randomSerial returns a random serial number of 128 bits, never zero.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	n, err := rand.Int(rand.Reader, limit.Sub(limit, big.NewInt(1)))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	// Serial numbers must be positive (RFC 5280 4.1.2.2).
	return n.Add(n, big.NewInt(1)), nil
}
