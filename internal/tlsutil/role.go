package tlsutil

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
)

// Role is what a certificate allows its holder to be in a cluster. It is
// carried in a DNS SAN of the certificate, RoleName(role, region).
type Role string

// The roles of csisupd certificates.
const (
	// RoleServer is a member of the raft control cluster.
	RoleServer Role = "server"
	// RoleClient is a node agent.
	RoleClient Role = "client"
	// RoleCLI is an operator or the CLI: any certificate signed by the CA
	// that carries neither the server nor the client name of the region.
	RoleCLI Role = "cli"
)

// DefaultRegion is the region of certificates and configurations that
// name none.
const DefaultRegion = "global"

// roleDomain is the DNS domain of the role names.
const roleDomain = "csisupd"

// RoleName returns the SAN of a role in a region: "server.global.csisupd".
// An empty region is DefaultRegion.
func RoleName(role Role, region string) string {
	if region == "" {
		region = DefaultRegion
	}
	return string(role) + "." + region + "." + roleDomain
}

// PeerRole returns the role the verified leaf certificate of a connection
// carries for region: RoleServer or RoleClient when it has that role's
// SAN (RoleServer when it has both), else RoleCLI: any other certificate
// the CA signed is an operator's. ok is false when the connection
// presented no verified certificate.
//
// Only cs.VerifiedChains[0][0] counts: a certificate that crypto/tls did
// not verify never gives a role. Connections accepted with
// Configurator.IncomingConfig have verified chains whenever the peer sent
// a certificate; outgoing connections made with OutgoingConfig verify the
// peer in VerifyConnection instead, so PeerRole reports ok false for them.
func PeerRole(cs tls.ConnectionState, region string) (role Role, ok bool) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false
	}
	names := cs.VerifiedChains[0][0].DNSNames
	for _, r := range []Role{RoleServer, RoleClient} {
		if hasName(names, RoleName(r, region)) {
			return r, true
		}
	}
	return RoleCLI, true
}

// hasName reports whether names holds name; DNS names compare without
// regard to case.
func hasName(names []string, name string) bool {
	return slices.ContainsFunc(names, func(n string) bool { return strings.EqualFold(n, name) })
}

// CheckRegion reports whether region can be part of a role name: one DNS
// label of letters, digits and hyphens, at most 63 characters, neither
// starting nor ending with a hyphen. An empty region is DefaultRegion and
// valid.
func CheckRegion(region string) error {
	if region == "" {
		return nil
	}
	if len(region) > 63 {
		return fmt.Errorf("region %q: longer than 63 characters", region)
	}
	for i, r := range region {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case r == '-' && i != 0 && i != len(region)-1:
		default:
			return fmt.Errorf("region %q: not a DNS label (letters, digits and inner hyphens only)", region)
		}
	}
	return nil
}

// checkRole reports whether role is one of the three roles.
func checkRole(role Role) error {
	switch role {
	case RoleServer, RoleClient, RoleCLI:
		return nil
	}
	return fmt.Errorf("role %q: want %s, %s or %s", role, RoleServer, RoleClient, RoleCLI)
}
