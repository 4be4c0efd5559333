package config

import (
	"net"
	"path/filepath"
	"testing"
)

// The examples in deploy/ are what operators copy; they must always load.
func TestDeployExamplesLoad(t *testing.T) {
	privateAddrs := func() ([]net.Addr, error) {
		return []net.Addr{&net.IPNet{IP: net.ParseIP("10.0.0.11"), Mask: net.CIDRMask(8, 32)}}, nil
	}
	for _, files := range [][]string{
		{"agent.hcl"},
		{"agent.hcl", "server.hcl"},
	} {
		var paths []string
		for _, f := range files {
			paths = append(paths, filepath.Join("..", "..", "deploy", f))
		}
		c, err := Load(LoadInput{Files: paths, Env: func(string) string { return "" }, InterfaceAddrs: privateAddrs})
		if err != nil {
			t.Fatalf("%v: %v", files, err)
		}
		if c.AdvertiseAddr != "10.0.0.11" {
			t.Errorf("%v: advertise_addr = %q, want the private address", files, c.AdvertiseAddr)
		}
		if len(files) == 2 && (!c.Server.Enabled || c.Server.BootstrapExpect != 3) {
			t.Errorf("%v: server block not applied: %+v", files, c.Server)
		}
	}
}
