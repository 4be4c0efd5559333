package config

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxFuzzConfig caps a fuzzed config file: real ones are a few KiB, and
// larger inputs only slow the search down.
const maxFuzzConfig = 64 << 10

// FuzzLoadConfig feeds arbitrary bytes as a config file through Load, the
// loader the agent uses, with an empty environment and fixed interface
// addresses. Load must never panic; a configuration it accepts must pass
// Validate again, and the settings of a server it enables the server's
// check; and each problem it reports must say where: the file
// and line, or, for a value left at its default, the key.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte("name = \"n1\"\nclient {\n  probe_interval = \"2s\"\n}\n"))
	f.Add([]byte("client { max_event_subscribers = 0 }\nclient { }\n"))
	f.Add([]byte("tls {\n  cert_file = \"/nonexistent/cert.pem\"\n}\nbogus = 1\n"))
	f.Add([]byte("name = \"n1\"\nserver {\n  enabled = true\n  bootstrap_expect = 1\n  raft_multiplier = 3\n}\n"))
	keys := schemaKeys()
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > maxFuzzConfig {
			t.Skip("larger than any real config file")
		}
		path := filepath.Join(t.TempDir(), "agent.hcl")
		if err := os.WriteFile(path, src, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(LoadInput{
			Files: []string{path},
			Env:   func(string) string { return "" },
			InterfaceAddrs: func() ([]net.Addr, error) {
				return []net.Addr{&net.IPNet{IP: net.IPv4(10, 0, 0, 5), Mask: net.CIDRMask(8, 32)}}, nil
			},
		})
		if err == nil {
			if err := c.Validate(); err != nil {
				t.Fatalf("Load accepted a configuration that Validate refuses: %v", err)
			}
			if c.Server.Enabled {
				if err := c.ServerSettings().Validate(); err != nil {
					t.Fatalf("Load accepted a server whose settings the server refuses: %v", err)
				}
			}
			return
		}
		at := regexp.MustCompile(`^` + regexp.QuoteMeta(path) + `:\d+: `)
		for _, e := range leaves(err) {
			msg := e.Error()
			if at.MatchString(msg) || startsWithKey(msg, keys) {
				continue
			}
			t.Errorf("problem names neither %s:LINE nor a key: %q", path, msg)
		}
	})
}

// leaves flattens errors joined by errors.Join.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}

// schemaKeys lists every configuration key, "name" or "client.rpc_timeout".
func schemaKeys() []string {
	var c Config
	top, blocks := c.schema()
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	for b, fields := range blocks {
		for k := range fields {
			keys = append(keys, b+"."+k)
		}
	}
	return keys
}

func startsWithKey(msg string, keys []string) bool {
	for _, k := range keys {
		if strings.HasPrefix(msg, k+": ") {
			return true
		}
	}
	return false
}

// The seed corpus parses as the fuzz target expects, so a broken seed
// shows up in the normal test run and not only under -fuzz.
func TestFuzzLoadConfigSeeds(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzLoadConfig"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("no seed corpus for FuzzLoadConfig")
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join("testdata", "fuzz", "FuzzLoadConfig", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), "go test fuzz v1\n[]byte(") {
			t.Errorf("%s is not a go test fuzz v1 []byte entry", e.Name())
		}
	}
	if leaves(errors.Join(errors.New("a"), errors.Join(errors.New("b")))) == nil {
		t.Fatal("leaves lost errors")
	}
}
