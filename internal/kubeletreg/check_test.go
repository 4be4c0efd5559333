package kubeletreg

import (
	"strings"
	"testing"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func validInfo() Info {
	return Info{Type: registerapi.CSIPlugin, Name: "hostpath.csi.k8s.io", Endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock", SupportedVersions: []string{"1.0.0"}}
}

func TestCheck(t *testing.T) {
	long := "/" + strings.Repeat("d", 107)
	tests := []struct {
		name   string
		change func(*Info)
		want   string // "" means accepted; else a substring of the error
	}{
		{"valid", func(*Info) {}, ""},
		{"unix URL endpoint", func(i *Info) { i.Endpoint = "unix:///run/csi/csi.sock" }, ""},
		{"two-part version", func(i *Info) { i.SupportedVersions = []string{"1.2"} }, ""},
		{"v prefix", func(i *Info) { i.SupportedVersions = []string{"v1.0.0"} }, ""},
		{"pre-release suffix", func(i *Info) { i.SupportedVersions = []string{"1.10.0-rc.1"} }, ""},
		{"leading space", func(i *Info) { i.SupportedVersions = []string{" 1.5.0"} }, ""},
		{"1.x among others", func(i *Info) { i.SupportedVersions = []string{"0.3.0", "garbage", "1.1.0", "2.0.0"} }, ""},
		{"longest endpoint", func(i *Info) { i.Endpoint = long[:107] }, ""},
		{"longest name", func(i *Info) { i.Name = strings.Repeat("n", 128) }, ""},

		{"DRA plugin", func(i *Info) { i.Type = registerapi.DRAPlugin }, `unsupported plugin type "DRAPlugin": csisupd supervises CSIPlugin only`},
		{"device plugin", func(i *Info) { i.Type = registerapi.DevicePlugin }, `unsupported plugin type "DevicePlugin"`},
		{"no type", func(i *Info) { i.Type = "" }, `unsupported plugin type ""`},
		{"lower-case type", func(i *Info) { i.Type = "csiplugin" }, `unsupported plugin type "csiplugin"`},
		{"empty name", func(i *Info) { i.Name = "" }, "plugin name is empty"},
		{"name with slash", func(i *Info) { i.Name = "a/b" }, `plugin name "a/b" is not a valid csisupd plugin id: it must match ^[A-Za-z0-9]`},
		{"name starting with dot", func(i *Info) { i.Name = ".hidden" }, `plugin name ".hidden" is not a valid`},
		{"name too long", func(i *Info) { i.Name = strings.Repeat("n", 129) }, "is not a valid csisupd plugin id"},
		{"empty endpoint", func(i *Info) { i.Endpoint = "" }, "endpoint is empty"},
		{"relative endpoint", func(i *Info) { i.Endpoint = "csi.sock" }, `endpoint "csi.sock" is not an absolute path`},
		{"relative unix URL", func(i *Info) { i.Endpoint = "unix://csi.sock" }, `endpoint "unix://csi.sock" is not an absolute path`},
		{"bare scheme", func(i *Info) { i.Endpoint = "unix://" }, `endpoint "unix://" names no path`},
		{"endpoint too long", func(i *Info) { i.Endpoint = long }, "may have at most 107"},
		{"endpoint with NUL", func(i *Info) { i.Endpoint = "/run/a\x00b" }, "NUL byte"},
		{"no versions", func(i *Info) { i.SupportedVersions = nil }, "no supported versions listed: csisupd speaks CSI 1.x"},
		{"0.x and 2.x", func(i *Info) { i.SupportedVersions = []string{"0.3.0", "2.0.0"} }, `no supported version in ["0.3.0" "2.0.0"]: csisupd speaks CSI 1.x`},
		{"one part", func(i *Info) { i.SupportedVersions = []string{"1"} }, `no supported version in ["1"]`},
		{"trailing dot", func(i *Info) { i.SupportedVersions = []string{"1."} }, `no supported version in ["1."]`},
		{"zero-prefixed major", func(i *Info) { i.SupportedVersions = []string{"01.0.0"} }, `no supported version in ["01.0.0"]`},
		{"garbage", func(i *Info) { i.SupportedVersions = []string{"one.zero", "", "x1.0"} }, `no supported version in ["one.zero" "" "x1.0"]`},
		{"overflowing number", func(i *Info) { i.SupportedVersions = []string{"1.99999999999999999999999"} }, "no supported version"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := validInfo()
			tt.change(&info)
			err := Check(info)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Check(%+v) = %v, want accepted", info, err)
			case tt.want != "" && err == nil:
				t.Fatalf("Check(%+v) accepted, want an error with %q", info, tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Fatalf("Check(%+v) = %q, want it to contain %q", info, err, tt.want)
			}
		})
	}
}

// TestCheckClipsHostileText checks that a registrar's strings cannot
// flood the reason sent back to it.
func TestCheckClipsHostileText(t *testing.T) {
	huge := strings.Repeat("x", 50000)
	many := make([]string, 1000)
	for i := range many {
		many[i] = "3.0"
	}
	for _, info := range []Info{
		{Type: huge},
		{Type: registerapi.CSIPlugin, Name: huge},
		{Type: registerapi.CSIPlugin, Name: "p", Endpoint: huge},
		{Type: registerapi.CSIPlugin, Name: "p", Endpoint: "/a.sock", SupportedVersions: []string{huge}},
		{Type: registerapi.CSIPlugin, Name: "p", Endpoint: "/a.sock", SupportedVersions: many},
	} {
		err := Check(info)
		if err == nil {
			t.Fatal("Check accepted a hostile registration")
		}
		if len(err.Error()) > 600 {
			t.Errorf("reason is %d bytes, want it clipped: %.100s...", len(err.Error()), err)
		}
	}
	err := Check(Info{Type: registerapi.CSIPlugin, Name: "p", Endpoint: "/a.sock", SupportedVersions: many})
	if !strings.Contains(err.Error(), "and 992 more") {
		t.Errorf("reason %q does not count the versions left out", err)
	}
}

func TestEndpointPath(t *testing.T) {
	tests := []struct {
		endpoint, want string
		ok             bool
	}{
		{"/run/csi/csi.sock", "/run/csi/csi.sock", true},
		{"unix:///run/csi/csi.sock", "/run/csi/csi.sock", true},
		{"/", "/", true},
		{"", "", false},
		{"unix://", "", false},
		{"unix:/run/csi.sock", "", false}, // only the unix:// form is stripped
		{"run/csi.sock", "", false},
		{"unix://run/csi.sock", "", false},
		{"tcp://127.0.0.1:10000", "", false},
		{"@abstract", "", false},
		{"/" + strings.Repeat("s", 106), "/" + strings.Repeat("s", 106), true},
		{"unix:///" + strings.Repeat("s", 106), "/" + strings.Repeat("s", 106), true},
		{"/" + strings.Repeat("s", 107), "", false},
	}
	for _, tt := range tests {
		got, err := EndpointPath(tt.endpoint)
		switch {
		case tt.ok && err != nil:
			t.Errorf("EndpointPath(%q) = %v, want %q", tt.endpoint, err, tt.want)
		case !tt.ok && err == nil:
			t.Errorf("EndpointPath(%q) = %q, want an error", tt.endpoint, got)
		case tt.ok && got != tt.want:
			t.Errorf("EndpointPath(%q) = %q, want %q", tt.endpoint, got, tt.want)
		case !tt.ok && !strings.Contains(err.Error(), "endpoint"):
			t.Errorf("EndpointPath(%q) error %q does not say it is about the endpoint", tt.endpoint, err)
		}
	}
}

func TestVersionMajor(t *testing.T) {
	tests := []struct {
		v     string
		major uint64
		ok    bool
	}{
		{"1.0.0", 1, true},
		{"1.2", 1, true},
		{"v1.0.0", 1, true},
		{"0.3.0", 0, true},
		{"2.0.0", 2, true},
		{"10.1", 10, true},
		{"1.0.0-alpha+build", 1, true},
		{"1.2.x", 1, true},
		{"1.02", 1, true}, // only the major may not have leading zeros
		{"\t1.0", 1, true},
		{"1", 0, false},
		{"1.", 0, false},
		{"v", 0, false},
		{"vv1.0", 0, false},
		{".1.0", 0, false},
		{"01.0", 0, false},
		{"00.1", 0, false},
		{"", 0, false},
		{"1.0.0 ", 1, true},
		{"18446744073709551616.0", 0, false},
	}
	for _, tt := range tests {
		major, ok := versionMajor(tt.v)
		if ok != tt.ok || major != tt.major {
			t.Errorf("versionMajor(%q) = %d, %t; want %d, %t", tt.v, major, ok, tt.major, tt.ok)
		}
	}
}
