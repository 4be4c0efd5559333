package nodevolumes

import (
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func TestUsageKey(t *testing.T) {
	cases := []struct {
		usage *csisupdv1.VolumeUsage
		want  string
	}{
		{nil, "rw-file-system-single-node-writer"},
		{&csisupdv1.VolumeUsage{ReadOnly: true, AccessType: "block", AccessMode: "MULTI_NODE_READER_ONLY"}, "ro-block-multi-node-reader-only"},
		{&csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"}, "rw-file-system-multi-node-multi-writer"},
		// Keys are paths of existing mounts: a usage without a mount group
		// keeps the key it had before mount groups existed.
		{&csisupdv1.VolumeUsage{FsType: "ext4", MountFlags: []string{"noatime", "uid=1000"}}, "rw-file-system-single-node-writer-c9b0aae0"},
	}
	for _, tc := range cases {
		u, err := normaliseUsage(tc.usage)
		if err != nil {
			t.Fatal(err)
		}
		if got := u.key(); got != tc.want {
			t.Errorf("key of %v = %q, want %q", tc.usage, got, tc.want)
		}
	}
	// Mount options add a hash: other options, another key.
	keys := map[string]bool{}
	for _, u := range []*csisupdv1.VolumeUsage{
		{FsType: "ext4"}, {FsType: "xfs"}, {MountFlags: []string{"noatime"}}, {FsType: "ext4", MountFlags: []string{"noatime"}},
		{FsType: "ext4noatime"}, {MountFlags: []string{"a", "b"}}, {MountFlags: []string{"ab"}},
		{VolumeMountGroup: "1000"}, {VolumeMountGroup: "2000"}, {FsType: "ext4", VolumeMountGroup: "1000"},
		{MountFlags: []string{"1000"}}, {FsType: "1000"},
	} {
		n, err := normaliseUsage(u)
		if err != nil {
			t.Fatal(err)
		}
		k := n.key()
		if len(k) != len("rw-file-system-single-node-writer-")+8 || keys[k] {
			t.Errorf("key of %v = %q: want a distinct key with 8 hex digits", u, k)
		}
		keys[k] = true
	}
}

func TestPluginPath(t *testing.T) {
	r := roots{Host: "/data/volumes/p", Plugin: "/csi"}
	for _, tc := range []struct{ host, want string }{
		{"/data/volumes/p/staging/v/k", "/csi/staging/v/k"},
		{"/data/volumes/p", "/csi"},
		{"", ""},
	} {
		if got, err := r.pluginPath(tc.host); err != nil || got != tc.want {
			t.Errorf("pluginPath(%q) = %q, %v; want %q", tc.host, got, err, tc.want)
		}
	}
	if _, err := r.pluginPath("/data/volumes/other/x"); err == nil {
		t.Error("a path outside the root was mapped")
	}
	same := roots{Host: "/data/volumes/p"}
	if got, _ := same.pluginPath("/data/volumes/p/x"); got != "/data/volumes/p/x" {
		t.Errorf("pluginPath without PluginMountDir = %q, want the host path", got)
	}
}

// FuzzCheckServerPath checks that a path the servers send is accepted only
// when it lies strictly below the mount's directory, with no ".." element
// that could climb out of it.
func FuzzCheckServerPath(f *testing.F) {
	root := roots{Host: "/var/lib/csisupd/volumes/tp"}
	dir := root.targetDir("w1", "v1")
	for _, seed := range []string{
		dir + "/" + "rw-file-system-single-node-writer",
		dir + "/../v2/x",
		dir + "/./x",
		dir + "//x",
		dir + "/x/",
		dir,
		"/etc/passwd",
		"relative/x",
		dir + "x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := root.checkServerPath("host_path", dir, p)
		if err != nil {
			if !strings.Contains(err.Error(), "host_path") {
				t.Errorf("error %q does not name the field", err)
			}
			return
		}
		if !strings.HasPrefix(p, dir+"/") || len(p) == len(dir)+1 {
			t.Errorf("%q accepted outside %q", p, dir)
		}
		for _, part := range strings.Split(strings.TrimPrefix(p, dir+"/"), "/") {
			if part == ".." || part == "." || part == "" {
				t.Errorf("%q accepted with the element %q", p, part)
			}
		}
	})
}
