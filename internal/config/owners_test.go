package config

import (
	"os/user"
	"slices"
	"strings"
	"testing"
)

func TestResolveOwner(t *testing.T) {
	tests := []struct {
		owner   string
		want    uint32
		wantErr string
	}{
		{owner: "0", want: 0},
		{owner: "65534", want: 65534},
		{owner: "4294967294", want: 4294967294},
		{owner: "007", want: 7},
		{owner: "root", want: 0},
		{owner: "", wantErr: "empty: give a user name or a numeric uid"},
		{owner: "4294967295", wantErr: `"4294967295" is not a valid uid (0 to 4294967294)`},
		{owner: "99999999999", wantErr: `"99999999999" is not a valid uid`},
		{owner: "12ab", wantErr: `"12ab" is not a valid uid`},
		{owner: "no-such-user-csisupd", wantErr: `unknown user "no-such-user-csisupd"`},
	}
	for _, tt := range tests {
		t.Run(tt.owner, func(t *testing.T) {
			if tt.owner == "root" {
				if _, err := user.Lookup("root"); err != nil {
					t.Skipf("no user root on this system: %v", err)
				}
			}
			got, err := resolveOwner(tt.owner)
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("resolveOwner(%q) = %d, %v; want an error containing %q", tt.owner, got, err, tt.wantErr)
				}
			case err != nil:
				t.Fatalf("resolveOwner(%q): %v", tt.owner, err)
			case got != tt.want:
				t.Fatalf("resolveOwner(%q) = %d, want %d", tt.owner, got, tt.want)
			}
		})
	}
}

// client.plugin_owners is resolved when the configuration is validated:
// names and numbers to uids, duplicates once. (An unknown name is an error
// naming the file, line, key and element: testdata/invalid/
// plugin_owners-unknown-user.)
func TestLoadPluginOwners(t *testing.T) {
	c := mustLoad(t, input{
		files: map[string]string{"agent.hcl": "client {\n  plugin_owners = [\"1000\", \"0\", \"1000\"]\n}"},
		paths: []string{"agent.hcl"},
	})
	if !slices.Equal(c.Client.PluginOwnerUIDs, []uint32{1000, 0}) {
		t.Errorf("PluginOwnerUIDs = %v, want [1000 0]", c.Client.PluginOwnerUIDs)
	}
	if c.Client.AllowInsecurePluginDir {
		t.Error("allow_insecure_plugin_dir is on by default")
	}
	if out := c.String(); !strings.Contains(out, "  allow_insecure_plugin_dir = false\n  plugin_owners = [\"1000\", \"0\", \"1000\"]\n") {
		t.Errorf("String() does not render the keys as set:\n%s", out)
	}
}
