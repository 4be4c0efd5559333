package volreq

import (
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// FuzzUsage feeds a claim's usage (fs type and two mount flags) to the
// validators of the servers and of a node. Whatever they let through is a
// plain name and options that each hold one option; the node never passes
// a privileged flag it does not allow.
func FuzzUsage(f *testing.F) {
	for _, seed := range [][3]string{
		{"ext4", "noatime", "uid=1000"},
		{"../../x", ",suid", "remount"},
		{"xfs", "bind", "a,b"},
		{"nfs4", "suid", "dev"},
		{"fuse.sshfs", "X-mount.mkdir", "ro\x00"},
		{"", "", "REMOUNT"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, fsType, a, b string) {
		u := &csisupdv1.VolumeUsage{FsType: fsType, MountFlags: []string{a, b}}
		if err := Usage("usage", u, privileged); err == nil {
			checkPassed(t, u)
		}
		err := MountVolume(&csisupdv1.MountVolumeRequest{Usage: u}, nil)
		if err != nil {
			return
		}
		checkPassed(t, u)
		for _, fl := range u.GetMountFlags() {
			name, _, _ := strings.Cut(strings.ToLower(fl), "=")
			if name == FlagSuid || name == FlagDev {
				t.Fatalf("node without allowed flags passed %q", fl)
			}
		}
	})
}

// checkPassed fails t when a usage that passed holds what no rule allows.
func checkPassed(t *testing.T, u *csisupdv1.VolumeUsage) {
	t.Helper()
	if fs := u.GetFsType(); strings.Contains(fs, "/") || strings.Contains(fs, "..") || len(fs) > 32 {
		t.Fatalf("fs type %q passed", fs)
	}
	for _, fl := range u.GetMountFlags() {
		name, _, _ := strings.Cut(strings.ToLower(fl), "=")
		if fl == "" || strings.ContainsAny(fl, ", \t\n\r\x00") || len(fl) > MaxMountFlagBytes {
			t.Fatalf("mount flag %q passed", fl)
		}
		if _, refused := refusedFlags[name]; refused {
			t.Fatalf("refused mount flag %q passed", fl)
		}
	}
}

// secretMark starts every secret value FuzzMapsAndCapacity sends.
const secretMark = "SECRET-VALUE-"

// FuzzMapsAndCapacity feeds a create request built from a map's shape and
// two capacities. A request that passes has no negative capacity, no limit
// below its minimum, and parameters within the caps; an error never holds
// a secret's value.
func FuzzMapsAndCapacity(f *testing.F) {
	f.Add(int64(-5), int64(0), uint16(1), uint16(1), "s3cr3t")
	f.Add(int64(1<<30), int64(1<<20), uint16(3), uint16(8), "value")
	f.Add(int64(0), int64(0), uint16(10000), uint16(1), "x")
	f.Add(int64(1), int64(1), uint16(1), uint16(65535), "y")
	f.Fuzz(func(t *testing.T, minBytes, maxBytes int64, n, valueLen uint16, secret string) {
		params := make(map[string]string, int(n))
		value := strings.Repeat("v", int(valueLen))
		for i := range int(n) {
			params[string(rune('a'+i%26))+strings.Repeat("k", i/26)] = value
		}
		req := &csisupdv1.VolumeCreateRequest{
			CapacityMinBytes: minBytes, CapacityMaxBytes: maxBytes, Parameters: params,
			Secrets: map[string]string{"token": secretMark + secret + strings.Repeat("s", int(valueLen)*20)},
		}
		err := CreateVolume(req)
		if err != nil {
			if strings.Contains(err.Error(), secretMark) {
				t.Fatalf("error %q holds the secret value", err)
			}
			return
		}
		size := 0
		for k, v := range params {
			size += len(k) + len(v)
		}
		switch {
		case minBytes < 0 || maxBytes < 0:
			t.Fatalf("negative capacity %d..%d passed", minBytes, maxBytes)
		case minBytes > 0 && maxBytes > 0 && maxBytes < minBytes:
			t.Fatalf("limit %d below minimum %d passed", maxBytes, minBytes)
		case len(params) > MaxMapEntries || size > MaxMapBytes:
			t.Fatalf("parameters of %d entries, %d bytes passed", len(params), size)
		}
	})
}

// FuzzVolumeMountGroup feeds volume mount groups to the validator: what it
// lets through is a group id the kernel accepts, spelt the one canonical
// way.
func FuzzVolumeMountGroup(f *testing.F) {
	for _, seed := range []string{"", "0", "1000", "4294967294", "4294967295", "01", "-1", "+1", "1e3", "wheel", " 7"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, group string) {
		if VolumeMountGroup("usage.volume_mount_group", group) != nil || group == "" {
			return
		}
		n, err := strconv.ParseUint(group, 10, 32)
		if err != nil || n > MaxGroupID || strconv.FormatUint(n, 10) != group {
			t.Fatalf("group %q passed (parsed %d, %v)", group, n, err)
		}
	})
}

// FuzzRequestText feeds free-form strings to a create request as its name,
// a parameter key, a topology value and a secret's value. What passes
// holds valid UTF-8 without control characters where it is printed (the
// secret's value excepted, which is never checked), and an error never
// holds the secret's value.
func FuzzRequestText(f *testing.F) {
	for _, seed := range [][4]string{
		{"db", "size", "zone-a", "s3cr3t"},
		{"\x1b[2J", "a\x07", "r1\n", "line\nbreak"},
		{"données", "größe", "zürich", "\xff"},
		{"db\xff", "\u009b", "\u2028", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, name, key, zone, secret string) {
		req := &csisupdv1.VolumeCreateRequest{
			Id: "v", PluginId: "p", Name: name, Parameters: map[string]string{key: "v"},
			Secrets: map[string]string{"token": secretMark + secret},
			AccessibilityRequirements: &csisupdv1.TopologyRequirement{
				Requisite: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": zone}}},
			},
		}
		err := CreateVolume(req)
		if err != nil {
			if strings.Contains(err.Error(), secretMark) {
				t.Fatalf("error %q holds the secret value", err)
			}
			return
		}
		for _, s := range []string{name, key, zone} {
			if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
				t.Fatalf("%q passed", s)
			}
		}
	})
}
