package tlsutil

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// A client certificate names the node it was made for in a URI SAN,
// NodeURI(region, name): csisupd://<region>/node/<name>. A URI SAN, not a
// DNS SAN like the role names, because:
//   - node names are not DNS names: they may hold '_' and run to 253
//     characters without a dot, so NAME.node.<region>.csisupd would not
//     always be a valid DNS name, and a CA's DNS name constraints or a
//     strict verifier would refuse it;
//   - the role is read from the DNS SANs only (PeerRole), so no node name,
//     whatever it is, can be read as a role, nor a role name as a node;
//   - hostname verification compares DNS SANs and IP SANs only, so the
//     node's name gives the certificate no host name to answer for.
const (
	// nodeURIScheme is the scheme of the URI SAN of a node name.
	nodeURIScheme = "csisupd"
	// nodeURIPath is the path of that URI before the node's name.
	nodeURIPath = "/node/"
)

// NodeURI returns the URI SAN that names node name in region:
// csisupd://<region>/node/<name>, the name path-escaped. An empty region
// is DefaultRegion.
func NodeURI(region, name string) *url.URL {
	return &url.URL{Scheme: nodeURIScheme, Host: cmp.Or(region, DefaultRegion), Path: nodeURIPath + name}
}

// CertNodeName returns the node a certificate names for region (a URI SAN
// NodeURI(region, name)): "" when it names none. URI SANs of other schemes
// and regions are ignored. A certificate that names two different nodes
// of the region is an error: a node certificate is for one node.
func CertNodeName(cert *x509.Certificate, region string) (string, error) {
	region = cmp.Or(region, DefaultRegion)
	var names []string
	for _, u := range cert.URIs {
		name, ok := nodeNameOf(u, region)
		if ok && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	switch len(names) {
	case 0:
		return "", nil
	case 1:
		return names[0], nil
	}
	return "", fmt.Errorf("certificate %q names %d nodes (%s): a node's certificate names one", cert.Subject.CommonName,
		len(names), strings.Join(names, ", "))
}

// nodeNameOf returns the node name u carries for region, false when u is
// not a node URI of the region.
func nodeNameOf(u *url.URL, region string) (string, bool) {
	if u == nil || u.Scheme != nodeURIScheme || !strings.EqualFold(u.Host, region) || u.User != nil ||
		u.Opaque != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return "", false
	}
	name, ok := strings.CutPrefix(u.Path, nodeURIPath)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", false
	}
	return name, true
}

// PeerNodeName returns the node the verified leaf certificate of a
// connection names for region (CertNodeName); "" when it names none or
// the connection presented no verified certificate. As for PeerRole, only
// cs.VerifiedChains[0][0] counts.
func PeerNodeName(cs tls.ConnectionState, region string) (string, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", nil
	}
	return CertNodeName(cs.VerifiedChains[0][0], region)
}

// checkNodeName checks, for a Configurator with Config.NodeName, that its
// own leaf, when it is a client certificate of the region, names that node
// and no other.
func (c *Configurator) checkNodeName(leaf *x509.Certificate) error {
	if c.cfg.NodeName == "" || !hasName(leaf.DNSNames, RoleName(RoleClient, c.region)) ||
		hasName(leaf.DNSNames, RoleName(RoleServer, c.region)) {
		return nil
	}
	fix := fmt.Sprintf("make one with `csisupd tls cert create --client --node %s`", c.cfg.NodeName)
	name, err := CertNodeName(leaf, c.region)
	switch {
	case err != nil:
		return fmt.Errorf("%w; %s", err, fix)
	case name == "":
		return fmt.Errorf("the client certificate names no node, and tls.verify_node_name is on: the servers would refuse every call of this agent (%s)", fix)
	case name != c.cfg.NodeName:
		return fmt.Errorf("the certificate names node %q, but this agent's name is %q (tls.verify_node_name is on): %s", name, c.cfg.NodeName, fix)
	}
	return nil
}

// checkNodeCert checks the node name of CertOptions: only a client
// certificate names a node, and the name must read back from the URI SAN
// as it was given (a name with a '/' would not).
func checkNodeCert(opts CertOptions) error {
	if opts.NodeName == "" {
		return nil
	}
	if opts.Role != RoleClient {
		return fmt.Errorf("node name %q: only a %s certificate names a node, not a %s one", opts.NodeName, RoleClient, opts.Role)
	}
	u, err := url.Parse(NodeURI(opts.Region, opts.NodeName).String())
	if err != nil {
		return fmt.Errorf("node name %q: %w", opts.NodeName, err)
	}
	if got, ok := nodeNameOf(u, cmp.Or(opts.Region, DefaultRegion)); !ok || got != opts.NodeName {
		return fmt.Errorf("node name %q: cannot be carried in a certificate's URI SAN", opts.NodeName)
	}
	return nil
}
