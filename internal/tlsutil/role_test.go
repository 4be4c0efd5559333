package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
)

func TestRoleName(t *testing.T) {
	tests := []struct {
		role   Role
		region string
		want   string
	}{
		{RoleServer, "global", "server.global.csisupd"},
		{RoleClient, "eu-west", "client.eu-west.csisupd"},
		{RoleCLI, "", "cli.global.csisupd"},
	}
	for _, tt := range tests {
		if got := RoleName(tt.role, tt.region); got != tt.want {
			t.Errorf("RoleName(%q, %q) = %q, want %q", tt.role, tt.region, got, tt.want)
		}
	}
}

func TestPeerRole(t *testing.T) {
	leaf := func(names ...string) *x509.Certificate { return &x509.Certificate{DNSNames: names} }
	chain := func(c *x509.Certificate) [][]*x509.Certificate { return [][]*x509.Certificate{{c, {}}} }
	server := leaf("server.global.csisupd", "localhost")
	tests := []struct {
		name     string
		cs       tls.ConnectionState
		region   string
		wantRole Role
		wantOK   bool
	}{
		{"server", tls.ConnectionState{VerifiedChains: chain(server)}, "global", RoleServer, true},
		{"region defaults to global", tls.ConnectionState{VerifiedChains: chain(server)}, "", RoleServer, true},
		{"client", tls.ConnectionState{VerifiedChains: chain(leaf("localhost", "client.global.csisupd"))}, "global", RoleClient, true},
		{"names compare without case", tls.ConnectionState{VerifiedChains: chain(leaf("Client.Global.CSISUPD"))}, "global", RoleClient, true},
		{"server and client: server", tls.ConnectionState{VerifiedChains: chain(leaf("client.global.csisupd", "server.global.csisupd"))}, "global", RoleServer, true},
		{"cli name", tls.ConnectionState{VerifiedChains: chain(leaf("cli.global.csisupd"))}, "global", RoleCLI, true},
		{"any other name is an operator", tls.ConnectionState{VerifiedChains: chain(leaf("ops.example.com"))}, "global", RoleCLI, true},
		{"no names is an operator", tls.ConnectionState{VerifiedChains: chain(leaf())}, "global", RoleCLI, true},
		{"server of another region is an operator", tls.ConnectionState{VerifiedChains: chain(server)}, "eu", RoleCLI, true},
		{"a name that only ends like the role name", tls.ConnectionState{VerifiedChains: chain(leaf("evil-server.global.csisupd", "x.server.global.csisupd"))}, "global", RoleCLI, true},
		{"only the first chain's leaf counts", tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf("cli.global.csisupd")}, {server}}}, "global", RoleCLI, true},
		{"presented but not verified", tls.ConnectionState{PeerCertificates: []*x509.Certificate{server}}, "global", "", false},
		{"empty chain", tls.ConnectionState{PeerCertificates: []*x509.Certificate{server}, VerifiedChains: [][]*x509.Certificate{{}}}, "global", "", false},
		{"no certificate", tls.ConnectionState{}, "global", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			role, ok := PeerRole(tt.cs, tt.region)
			if role != tt.wantRole || ok != tt.wantOK {
				t.Errorf("PeerRole = %q, %v; want %q, %v", role, ok, tt.wantRole, tt.wantOK)
			}
		})
	}
}

func TestCheckRegion(t *testing.T) {
	tests := []struct {
		region string
		ok     bool
	}{
		{"", true},
		{"global", true},
		{"eu-west-1", true},
		{"EU", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"eu.west", false},
		{"-eu", false},
		{"eu-", false},
		{"eu west", false},
		{"é", false},
	}
	for _, tt := range tests {
		if err := CheckRegion(tt.region); (err == nil) != tt.ok {
			t.Errorf("CheckRegion(%q) = %v, want ok %v", tt.region, err, tt.ok)
		}
	}
}
