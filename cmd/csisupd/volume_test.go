package main

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseAccessMode(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "single-node-writer", want: "SINGLE_NODE_WRITER"},
		{in: "MULTI_NODE_MULTI_WRITER", want: "MULTI_NODE_MULTI_WRITER"},
		{in: "single-node-reader-only", want: "SINGLE_NODE_READER_ONLY"},
		{in: "unknown", wantErr: true},
		{in: "writer", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseAccessMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseAccessMode(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.As(err, new(usageError)) {
			t.Errorf("parseAccessMode(%q): error %v is not a usage error", tt.in, err)
		}
	}
}

func TestParseKeyValues(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{in: nil, want: nil},
		{in: []string{"a=1", "b=x=y", "c="}, want: map[string]string{"a": "1", "b": "x=y", "c": ""}},
		{in: []string{"a=1", "a=2"}, want: map[string]string{"a": "2"}},
		{in: []string{"novalue"}, wantErr: true},
		{in: []string{"=v"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseKeyValues("parameter", tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("parseKeyValues(%q): error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if err != nil && !errors.As(err, new(usageError)) {
			t.Errorf("parseKeyValues(%q): error %v is not a usage error", tt.in, err)
		}
		if len(got) != len(tt.want) {
			t.Errorf("parseKeyValues(%q) = %v, want %v", tt.in, got, tt.want)
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("parseKeyValues(%q)[%q] = %q, want %q", tt.in, k, got[k], v)
			}
		}
	}
}

func TestFormatBytes(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "-"},
		{512, "512 B"},
		{1 << 10, "1 KiB"},
		{3 << 29, "1.5 GiB"},
		{20 << 30, "20 GiB"},
		{20<<30 + 1, "20.0 GiB"},
		{1 << 40, "1 TiB"},
	}
	for _, tt := range tests {
		if got := formatBytes(tt.in); got != tt.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestAccessModeName(t *testing.T) {
	tests := []struct{ in, want string }{
		{"SINGLE_NODE_WRITER", "single-node-writer"},
		{"MULTI_NODE_MULTI_WRITER", "multi-node-multi-writer"},
		{"", ""},
	}
	for _, tt := range tests {
		got := accessModeName(tt.in)
		if got != tt.want {
			t.Errorf("accessModeName(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if tt.in == "" {
			continue
		}
		// The name printed is one the flags take back.
		if back, err := parseAccessMode(got); err != nil || back != tt.in {
			t.Errorf("parseAccessMode(%q) = %q, %v; want %q", got, back, err, tt.in)
		}
	}
}

func TestCapabilityFlags(t *testing.T) {
	tests := []struct {
		name    string
		flags   capabilityFlags
		wantErr bool
	}{
		{name: "mount with fs type", flags: capabilityFlags{accessType: "mount", accessMode: "single-node-writer", fsType: "ext4"}},
		{name: "block", flags: capabilityFlags{accessType: "block", accessMode: "multi-node-multi-writer"}},
		{name: "block with fs type", flags: capabilityFlags{accessType: "block", accessMode: "single-node-writer", fsType: "xfs"}, wantErr: true},
		{name: "bad access type", flags: capabilityFlags{accessType: "file", accessMode: "single-node-writer"}, wantErr: true},
		{name: "bad access mode", flags: capabilityFlags{accessType: "mount", accessMode: "everyone"}, wantErr: true},
	}
	for _, tt := range tests {
		c, err := tt.flags.capability()
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: error %v, want error %v", tt.name, err, tt.wantErr)
			continue
		}
		if err != nil {
			if !errors.As(err, new(usageError)) {
				t.Errorf("%s: error %v is not a usage error", tt.name, err)
			}
			continue
		}
		if c.GetAccessType() != tt.flags.accessType || c.GetFsType() != tt.flags.fsType || c.GetAccessMode() == "" {
			t.Errorf("%s: capability %v", tt.name, c)
		}
	}
}

// runAt returns a function that runs the CLI against addr and returns its
// output, failing the test on an error.
func runAt(t *testing.T, addr string) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, err := execute(t, append([]string{"--address", addr}, args...)...)
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		return out
	}
}

func TestVolumeCommands(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	run := runAt(t, addr)

	out := run("volume", "create", "data", "--plugin", "tp", "--capacity", "2MiB", "--fs-type", "ext4",
		"--parameter", "tier=gold", "--secret", "token=s3cr3t")
	if !strings.HasPrefix(out, "Created volume data (plugin tp, external id ") || strings.Contains(out, "s3cr3t") {
		t.Fatalf("create: %q", out)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "data")
	const volumeKeys = "accessible_topology,availability,capabilities,capacity_bytes,capacity_limit_bytes,claims,conditions,content_source,context,controller_node_id,create_index,created_at,ephemeral,expansion,external_id,id,modify_index,mutable_parameters,parameters,plugin_id"
	if keys(vol) != volumeKeys {
		t.Fatalf("volume keys %s, want %s", keys(vol), volumeKeys)
	}
	caps := vol["capabilities"].([]any)
	if len(caps) != 1 || caps[0].(map[string]any)["fs_type"] != "ext4" || caps[0].(map[string]any)["access_mode"] != "SINGLE_NODE_WRITER" {
		t.Fatalf("capabilities: %v", caps)
	}
	// capacity_bytes is an int64: a string in the proto3 JSON mapping.
	if capacity, err := strconv.ParseInt(vol["capacity_bytes"].(string), 10, 64); err != nil || capacity < 2<<20 ||
		vol["parameters"].(map[string]any)["tier"] != "gold" {
		t.Fatalf("volume: %v", vol)
	}

	claim := mustJSON(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-1")
	if claim["node_id"] != a.NodeID() || claim["csi_node_id"] != "csi-a" || claim["read_only"] != false ||
		claim["state"] != "taken" || claim["workload_id"] != "job-1" || claim["host_path"] == "" {
		t.Fatalf("claim: %v", claim)
	}
	if out := run("volume", "claim", "data", "--node", a.Name, "--workload", "job-1"); !strings.Contains(out, "Host path: "+claim["host_path"].(string)) {
		t.Fatalf("claim again (human): %q", out)
	}
	if out := run("volume", "list"); !strings.Contains(out, "data") || !strings.Contains(out, a.NodeID()) || !strings.Contains(out, "2 MiB") {
		t.Fatalf("volume list: %q", out)
	}
	if out := run("volume", "status", "data"); !strings.Contains(out, "job-1") || !strings.Contains(out, "taken") {
		t.Fatalf("volume status: %q", out)
	}
	if out, err := execute(t, "--address", a.RPCAddr, "status"); err != nil || !strings.Contains(out, "Mounts") || !strings.Contains(out, claim["host_path"].(string)) {
		t.Fatalf("status of the agent lists no mount: %q, %v", out, err)
	}
	if _, err := execute(t, "--address", addr, "volume", "claim", "data", "--node", "nowhere", "--workload", "w"); err == nil ||
		!strings.Contains(err.Error(), `node "nowhere" not found`) {
		t.Fatalf("claim on an unknown node: %v", err)
	}
	if _, err := execute(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-2", "--block"); err == nil ||
		!strings.Contains(err.Error(), "claim refused (capability)") {
		t.Fatalf("block claim of a mount volume: %v", err)
	}
	// A mount group: refused with a usage error beside --block, by the
	// servers when malformed, and, unless the node's plugin has
	// VOLUME_MOUNT_GROUP, with the capability, plugin and node named.
	if _, err := execute(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-3", "--block", "--mount-group", "1000"); !errors.As(err, new(usageError)) ||
		!strings.Contains(err.Error(), "--mount-group") {
		t.Fatalf("--block --mount-group: %v, want a usage error", err)
	}
	if _, err := execute(t, "--address", addr, "volume", "claim", "data", "--node", a.Name, "--workload", "job-3", "--mount-group", "staff"); err == nil ||
		!strings.Contains(err.Error(), `usage.volume_mount_group "staff" is not a group id`) {
		t.Fatalf("--mount-group staff: %v", err)
	}
	if out, err := execute(t, "--address", addr, "--json", "volume", "claim", "data", "--node", a.Name, "--workload", "job-3", "--mount-group", "1000"); err != nil {
		t.Logf("--mount-group 1000 refused: %v", err)
		for _, want := range []string{"VOLUME_MOUNT_GROUP", `plugin "tp"`, `node "` + a.NodeID() + `"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("--mount-group 1000 refused: %v; want it to name %s", err, want)
			}
		}
	} else {
		if !strings.Contains(out, `"volume_mount_group": "1000"`) && !strings.Contains(out, `"volume_mount_group":"1000"`) {
			t.Errorf("--mount-group 1000 claimed, but the claim's usage has no group: %s", out)
		}
		run("volume", "release", "data", "--node", a.NodeID(), "--workload", "job-3")
	}
	run("volume", "release", "data", "--node", a.NodeID(), "--workload", "job-1")
	if v := mustJSON(t, "--address", addr, "volume", "status", "data"); len(v["claims"].([]any)) != 0 {
		t.Fatalf("claims after release: %v", v["claims"])
	}

	run("volume", "register", "old", "--plugin", "tp", "--external-id", "ext-1", "--context", "k=v")
	list := mustJSON(t, "--address", addr, "volume", "list", "--plugin", "tp")
	if vs := list["volumes"].([]any); len(vs) != 2 {
		t.Fatalf("volume list --plugin tp: %v", vs)
	}
	if other := mustJSON(t, "--address", addr, "volume", "list", "--plugin", "other"); len(other["volumes"].([]any)) != 0 {
		t.Fatalf("volume list --plugin other: %v", other)
	}
	// delete prints its call's response, VolumeDeleteResponse: the claims
	// a forced deregistration left, none here; the exit code says it
	// worked.
	del := mustJSON(t, "--address", addr, "volume", "delete", "old", "--deregister-only")
	if keys(del) != "claims_left" || len(del["claims_left"].([]any)) != 0 {
		t.Fatalf("delete --json: %v, want no claims left", del)
	}
	if _, err := execute(t, "--address", addr, "volume", "status", "old"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("status of a deregistered volume: %v", err)
	}
	if out := run("volume", "delete", "data"); out != "Deleted volume data\n" {
		t.Fatalf("delete: %q", out)
	}
	if out := run("volume", "list"); out != "No volumes.\n" {
		t.Fatalf("volume list after delete: %q", out)
	}
}
