package volreq

import (
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// wantErr checks err against want: "" means no error, anything else a
// part the error's text must hold.
func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %q, want none", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one holding %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q, want it to hold %q", err, want)
	}
}

func TestMountFlags(t *testing.T) {
	tooMany := make([]string, MaxMountFlags+1)
	for i := range tooMany {
		tooMany[i] = "ro"
	}
	tests := []struct {
		name    string
		flags   []string
		allowed []string
		want    string
	}{
		{"none", nil, nil, ""},
		{"plain options", []string{"noatime", "uid=1000", "gid=1000", "nosuid", "nodev", "noexec", "ro"}, nil, ""},
		{"selinux context", []string{`context="system_u:object_r:svirt_sandbox_file_t:s0"`}, nil, ""},
		{"empty", []string{"noatime", ""}, nil, `mount_flags[1] is empty`},
		{"leading comma", []string{",suid"}, nil, `mount_flags[0] ",suid" holds a comma`},
		{"two in one", []string{"a,b"}, nil, `"a,b" holds a comma`},
		{"space", []string{"uid= 0"}, nil, `"uid= 0" holds whitespace`},
		{"tab", []string{"ro\tbind"}, nil, `holds whitespace`},
		{"newline", []string{"ro\n"}, nil, `holds whitespace`},
		{"control character", []string{"ro\x00"}, nil, `control character`},
		{"invalid utf-8", []string{"ro\xff"}, nil, `not valid UTF-8`},
		{"remount", []string{"remount"}, nil, `"remount" is not allowed: it changes an existing mount`},
		{"remount upper case", []string{"REMOUNT"}, nil, `"REMOUNT" is not allowed`},
		{"bind", []string{"bind"}, nil, `"bind" is not allowed: it mounts a host path`},
		{"rbind", []string{"rbind"}, nil, `"rbind" is not allowed`},
		{"move", []string{"move"}, nil, `"move" is not allowed`},
		{"loop with a device", []string{"loop=/dev/loop0"}, nil, `"loop=/dev/loop0" is not allowed`},
		{"propagation", []string{"rshared"}, nil, `mount propagation`},
		{"x-mount", []string{"X-mount.mkdir"}, nil, `X-mount options`},
		{"x-mount subdir", []string{"x-mount.subdir=../../etc"}, nil, `X-mount options`},
		{"suid not allowed", []string{"suid"}, nil, `"suid" is not allowed on this node: its agent's client.allow_mount_flags does not list "suid"`},
		{"dev not allowed", []string{"dev"}, []string{FlagSuid}, `"dev" is not allowed on this node`},
		{"suid allowed", []string{"suid"}, []string{FlagSuid}, ""},
		{"both allowed", []string{"suid", "dev"}, []string{FlagSuid, FlagDev}, ""},
		{"too long", []string{"uid=" + strings.Repeat("1", MaxMountFlagBytes)}, nil, `mount_flags[0] is 260 bytes long, more than the 256 allowed`},
		{"longest", []string{strings.Repeat("a", MaxMountFlagBytes)}, nil, ""},
		{"too many", tooMany, nil, `has 65 flags, more than the 64 allowed`},
		{"most", tooMany[:MaxMountFlags], nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, MountFlags("usage.mount_flags", tt.flags, tt.allowed), tt.want)
		})
	}
}

func TestFSType(t *testing.T) {
	tests := []struct {
		fsType string
		want   string
	}{
		{"", ""},
		{"ext4", ""},
		{"xfs", ""},
		{"nfs4", ""},
		{"fuse.sshfs", ""},
		{"ntfs-3g", ""},
		{"9p", ""},
		{strings.Repeat("a", 32), ""},
		{strings.Repeat("a", 33), `is not a file system type name`},
		{"../../x", `fs_type "../../x" is not a file system type name`},
		{"a..b", `is not a file system type name`},
		{"/bin/sh", `is not a file system type name`},
		{"ext4/x", `is not a file system type name`},
		{"EXT4", `is not a file system type name`},
		{".hidden", `is not a file system type name`},
		{"ext4 ", `is not a file system type name`},
		{"ext4,bind", `is not a file system type name`},
	}
	for _, tt := range tests {
		t.Run(tt.fsType, func(t *testing.T) {
			wantErr(t, FSType("usage.fs_type", tt.fsType), tt.want)
		})
	}
}

func TestVolumeMountGroup(t *testing.T) {
	tests := []struct{ group, want string }{
		{"", ""},
		{"0", ""},
		{"1000", ""},
		{"4294967294", ""},
		{"4294967295", `out of range: group ids go from 0 to 4294967294`},
		{"9999999999", `out of range`},
		{"10000000000", `is not a group id`},
		{"01000", `is not a group id: give a decimal number from 0 to 4294967294 without leading zeros`},
		{"-1", `is not a group id`},
		{"+5", `is not a group id`},
		{"1e3", `is not a group id`},
		{" 1000", `is not a group id`},
		{"1000\n", `is not a group id`},
		{"wheel", `"wheel" is not a group id`},
		{"١٢", `is not a group id`}, // Arabic-Indic digits are not ASCII digits
	}
	for _, tt := range tests {
		t.Run(tt.group, func(t *testing.T) {
			wantErr(t, VolumeMountGroup("usage.volume_mount_group", tt.group), tt.want)
		})
	}
}

func TestUsageAndCapabilities(t *testing.T) {
	usages := []struct {
		name    string
		usage   *csisupdv1.VolumeUsage
		allowed []string
		want    string
	}{
		{"nil", nil, nil, ""},
		{"ordinary", &csisupdv1.VolumeUsage{FsType: "ext4", MountFlags: []string{"noatime"}}, nil, ""},
		{"bad fs type", &csisupdv1.VolumeUsage{FsType: "../../x"}, nil, `usage.fs_type "../../x"`},
		{"bad flag", &csisupdv1.VolumeUsage{MountFlags: []string{"bind"}}, nil, `usage.mount_flags[0] "bind"`},
		{"suid at the servers", &csisupdv1.VolumeUsage{MountFlags: []string{"suid", "dev"}}, privileged, ""},
		{"suid on a node", &csisupdv1.VolumeUsage{MountFlags: []string{"suid"}}, nil, `usage.mount_flags[0] "suid" is not allowed on this node`},
		{"mount group", &csisupdv1.VolumeUsage{VolumeMountGroup: "1000"}, nil, ""},
		{"bad mount group", &csisupdv1.VolumeUsage{VolumeMountGroup: "staff"}, nil, `usage.volume_mount_group "staff" is not a group id`},
		{"block mount group", &csisupdv1.VolumeUsage{AccessType: "block", VolumeMountGroup: "1000"}, nil, `usage.volume_mount_group applies to access_type mount only`},
	}
	for _, tt := range usages {
		t.Run("usage "+tt.name, func(t *testing.T) {
			wantErr(t, Usage("usage", tt.usage, tt.allowed), tt.want)
		})
	}
	tooMany := make([]*csisupdv1.VolumeCapability, MaxCapabilities+1)
	caps := []struct {
		name string
		caps []*csisupdv1.VolumeCapability
		want string
	}{
		{"none", nil, ""},
		{"suid passes at the servers", []*csisupdv1.VolumeCapability{{MountFlags: []string{"suid"}}}, ""},
		{"second bad", []*csisupdv1.VolumeCapability{{FsType: "ext4"}, {MountFlags: []string{"remount"}}}, `capabilities[1].mount_flags[0] "remount"`},
		{"bad fs type", []*csisupdv1.VolumeCapability{{FsType: "a/b"}}, `capabilities[0].fs_type "a/b"`},
		{"too many", tooMany, `has 65 capabilities, more than the 64 allowed`},
	}
	for _, tt := range caps {
		t.Run("capabilities "+tt.name, func(t *testing.T) {
			wantErr(t, Capabilities("capabilities", tt.caps), tt.want)
		})
	}
}
