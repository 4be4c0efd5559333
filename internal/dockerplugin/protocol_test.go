package dockerplugin_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/dockerplugin"
)

const (
	// nodeID is the fake cluster's node.
	nodeID = "node-1"
	// Mount ids: 64 hex, as Docker and Podman send them.
	idA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	idB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// getResp is the answer of VolumeDriver.Get as Docker decodes it.
type getResp struct {
	Volume struct {
		Name       string
		Mountpoint string
		CreatedAt  string
		Status     struct {
			Plugin        string `json:"plugin"`
			CapacityBytes int64  `json:"capacity_bytes"`
			Claims        []struct {
				NodeID     string `json:"node_id"`
				WorkloadID string `json:"workload_id"`
				State      string `json:"state"`
				Owner      string `json:"owner"`
			} `json:"claims"`
		}
	}
}

// TestDockerSequence replays the calls Docker makes, as its volume plugin
// documentation describes them, for `docker volume create`, inspect, ls,
// two containers running with the volume, and `docker volume rm`.
func TestDockerSequence(t *testing.T) {
	fc := newFakeCluster(nodeID)
	c := startServer(t, testConfig(t, fc))

	var act struct{ Implements []string }
	c.ok("/Plugin.Activate", nil, &act)
	if !slices.Equal(act.Implements, []string{"VolumeDriver"}) {
		t.Fatalf("Activate implements %v, want [VolumeDriver]", act.Implements)
	}
	var caps struct{ Capabilities struct{ Scope string } }
	c.ok("/VolumeDriver.Capabilities", struct{}{}, &caps)
	if caps.Capabilities.Scope != "global" {
		t.Fatalf("scope %q, want global", caps.Capabilities.Scope)
	}

	c.ok("/VolumeDriver.Create", createReq{Name: "v1", Opts: map[string]string{"size": "16MiB"}}, nil)
	if got := fc.created(); len(got) != 1 || got[0].GetPluginId() != "testplugin" || got[0].GetCapacityMinBytes() != 16<<20 {
		t.Fatalf("CreateVolume requests %v, want one of plugin testplugin, 16 MiB", got)
	}

	var g getResp
	c.ok("/VolumeDriver.Get", nameReq{Name: "v1"}, &g)
	if g.Volume.Name != "v1" || g.Volume.Mountpoint != "" || g.Volume.Status.Plugin != "testplugin" ||
		g.Volume.Status.CapacityBytes != 16<<20 || len(g.Volume.Status.Claims) != 0 || g.Volume.CreatedAt != "2025-01-02T03:04:05Z" {
		t.Fatalf("Get before a mount: %+v", g.Volume)
	}
	var l struct {
		Volumes []struct{ Name, Mountpoint string }
	}
	c.ok("/VolumeDriver.List", nil, &l)
	if len(l.Volumes) != 1 || l.Volumes[0].Name != "v1" || l.Volumes[0].Mountpoint != "" {
		t.Fatalf("List: %+v", l.Volumes)
	}
	var p mountResp
	c.ok("/VolumeDriver.Path", nameReq{Name: "v1"}, &p)
	if p.Mountpoint != "" {
		t.Fatalf("Path before a mount: %q, want empty", p.Mountpoint)
	}

	// Two containers: two claims, each with its own host path.
	var ma, mb mountResp
	c.ok("/VolumeDriver.Mount", mountReq{Name: "v1", ID: idA}, &ma)
	c.ok("/VolumeDriver.Mount", mountReq{Name: "v1", ID: idB}, &mb)
	if ma.Mountpoint == "" || mb.Mountpoint == "" || ma.Mountpoint == mb.Mountpoint {
		t.Fatalf("mount points %q and %q: want two distinct host paths", ma.Mountpoint, mb.Mountpoint)
	}
	want := []string{dockerplugin.WorkloadPrefix + idA, dockerplugin.WorkloadPrefix + idB}
	if got := fc.workloads("v1"); !slices.Equal(got, want) {
		t.Fatalf("claims of v1: %v, want %v", got, want)
	}
	// A daemon restart sends Mount again for a running container: the
	// same claim and path.
	var again mountResp
	c.ok("/VolumeDriver.Mount", mountReq{Name: "v1", ID: idA}, &again)
	if again.Mountpoint != ma.Mountpoint || !slices.Equal(fc.workloads("v1"), want) {
		t.Fatalf("Mount again: %q and claims %v, want %q and %v", again.Mountpoint, fc.workloads("v1"), ma.Mountpoint, want)
	}

	c.ok("/VolumeDriver.Path", nameReq{Name: "v1"}, &p)
	if p.Mountpoint != ma.Mountpoint {
		t.Fatalf("Path: %q, want the first workload's %q", p.Mountpoint, ma.Mountpoint)
	}
	c.ok("/VolumeDriver.Get", nameReq{Name: "v1"}, &g)
	if g.Volume.Mountpoint != ma.Mountpoint || len(g.Volume.Status.Claims) != 2 {
		t.Fatalf("Get with two mounts: %+v", g.Volume)
	}
	for i, cl := range g.Volume.Status.Claims {
		if cl.WorkloadID != want[i] || cl.NodeID != nodeID || cl.State != "taken" || cl.Owner != dockerplugin.Owner {
			t.Errorf("Get's claim %d: %+v, want workload %s on %s, taken, owner %s", i, cl, want[i], nodeID, dockerplugin.Owner)
		}
	}

	c.ok("/VolumeDriver.Unmount", mountReq{Name: "v1", ID: idA}, nil)
	if got := fc.workloads("v1"); !slices.Equal(got, want[1:]) {
		t.Fatalf("claims after Unmount of %s: %v, want %v", idA, got, want[1:])
	}

	// Remove with a claim left: Docker's error shape, naming the claim.
	errText := c.fails("/VolumeDriver.Remove", nameReq{Name: "v1"})
	for _, s := range []string{"in use", want[1], nodeID, "stop the containers"} {
		if !strings.Contains(errText, s) {
			t.Errorf("Remove of a claimed volume: Err %q does not contain %q", errText, s)
		}
	}
	if fc.workloads("v1") == nil {
		t.Fatal("Remove of a claimed volume deleted it")
	}

	c.ok("/VolumeDriver.Unmount", mountReq{Name: "v1", ID: idB}, nil)
	c.ok("/VolumeDriver.Remove", nameReq{Name: "v1"}, nil)
	if fc.workloads("v1") != nil {
		t.Fatal("v1 still exists after Remove")
	}
	// Remove and Unmount again: the volume is gone, nothing to do.
	c.ok("/VolumeDriver.Remove", nameReq{Name: "v1"}, nil)
	c.ok("/VolumeDriver.Unmount", mountReq{Name: "v1", ID: idB}, nil)
	if e := c.fails("/VolumeDriver.Get", nameReq{Name: "v1"}); !strings.Contains(e, "no such volume") {
		t.Fatalf("Get after Remove: Err %q, want one containing \"no such volume\"", e)
	}
}

// TestPodmanSequence replays the calls podman 4.3 made, in order, for
// `podman volume create --driver csisupd -o ... v1`, `podman run -v
// v1:/data`, and `podman volume rm v1`: Activate and List without a body,
// the content type it sends, Get of the unknown name first.
func TestPodmanSequence(t *testing.T) {
	fc := newFakeCluster(nodeID)
	cfg := testConfig(t, fc)
	cfg.DefaultPlugin = ""
	c := startServer(t, cfg)
	const podmanType = "application/vnd.docker.plugins.v1.1+json"

	a := c.do(http.MethodPost, "/Plugin.Activate", podmanType, nil)
	var act struct{ Implements []string }
	a.decode(t, &act)
	if a.status != http.StatusOK || !slices.Contains(act.Implements, "VolumeDriver") {
		t.Fatalf("Activate: %d %s", a.status, a.body)
	}
	a = c.do(http.MethodPost, "/VolumeDriver.Get", podmanType, []byte(`{"Name":"v1"}`))
	if e := a.errText(t); !strings.Contains(e, "no such volume") {
		t.Fatalf("Get of an unknown volume: Err %q, want one containing \"no such volume\"", e)
	}
	a = c.do(http.MethodPost, "/VolumeDriver.Create", "application/json", []byte(`{"Name":"v1","Opts":{"plugin":"testplugin","size":"16MiB"}}`))
	if a.status != http.StatusOK {
		t.Fatalf("Create: %d %s", a.status, a.body)
	}
	a = c.do(http.MethodPost, "/VolumeDriver.Mount", podmanType, []byte(`{"Name":"v1","ID":"`+idA+`"}`))
	var m mountResp
	a.decode(t, &m)
	if a.status != http.StatusOK || m.Mountpoint == "" {
		t.Fatalf("Mount: %d %s", a.status, a.body)
	}
	if got := fc.workloads("v1"); !slices.Equal(got, []string{"docker-" + idA}) {
		t.Fatalf("claims while the container runs: %v", got)
	}
	if a = c.do(http.MethodPost, "/VolumeDriver.Unmount", podmanType, []byte(`{"Name":"v1","ID":"`+idA+`"}`)); a.status != http.StatusOK {
		t.Fatalf("Unmount: %d %s", a.status, a.body)
	}
	if got := fc.workloads("v1"); len(got) != 0 {
		t.Fatalf("claims after the container: %v, want none", got)
	}
	a = c.do(http.MethodPost, "/VolumeDriver.List", podmanType, nil)
	var l struct{ Volumes []struct{ Name string } }
	a.decode(t, &l)
	if a.status != http.StatusOK || len(l.Volumes) != 1 || l.Volumes[0].Name != "v1" {
		t.Fatalf("List: %d %s", a.status, a.body)
	}
	if a = c.do(http.MethodPost, "/VolumeDriver.Remove", podmanType, []byte(`{"Name":"v1"}`)); a.status != http.StatusOK {
		t.Fatalf("Remove: %d %s", a.status, a.body)
	}
	if fc.workloads("v1") != nil {
		t.Fatal("v1 exists after Remove")
	}
}

// TestCreateAdopts checks that Create of an existing volume adopts it
// without creating, unless the options name another plugin.
func TestCreateAdopts(t *testing.T) {
	fc := newFakeCluster(nodeID)
	fc.addVolume(&csisupdv1.Volume{Id: "shared", PluginId: "other"})
	c := startServer(t, testConfig(t, fc))

	// The default plugin differs, but no plugin was named: adopted.
	c.ok("/VolumeDriver.Create", createReq{Name: "shared"}, nil)
	c.ok("/VolumeDriver.Create", createReq{Name: "shared", Opts: map[string]string{"plugin": "other", "size": "1GiB"}}, nil)
	if got := fc.created(); len(got) != 0 {
		t.Fatalf("adoption called CreateVolume: %v", got)
	}
	e := c.fails("/VolumeDriver.Create", createReq{Name: "shared", Opts: map[string]string{"plugin": "testplugin"}})
	for _, s := range []string{`"shared"`, `"other"`, `"testplugin"`} {
		if !strings.Contains(e, s) {
			t.Errorf("Create naming another plugin: Err %q does not name %s", e, s)
		}
	}
	// Bad options are refused even for an existing volume.
	if e := c.fails("/VolumeDriver.Create", createReq{Name: "shared", Opts: map[string]string{"sise": "1G"}}); !strings.Contains(e, `"sise"`) {
		t.Errorf("Create with an unknown option: Err %q", e)
	}
}

// TestCreateWithoutPlugin checks the error of a Create that names no
// plugin when there is no default.
func TestCreateWithoutPlugin(t *testing.T) {
	fc := newFakeCluster(nodeID)
	cfg := testConfig(t, fc)
	cfg.DefaultPlugin = ""
	c := startServer(t, cfg)
	e := c.fails("/VolumeDriver.Create", createReq{Name: "v1"})
	if !strings.Contains(e, "-o plugin=") || !strings.Contains(e, "docker.default_plugin") {
		t.Fatalf("Err %q, want advice naming -o plugin= and docker.default_plugin", e)
	}
	if len(fc.created()) != 0 {
		t.Fatal("CreateVolume called without a plugin")
	}
}

// TestBadCalls checks that every malformed call gets an answer with a
// body {"Err"} and the plugins' content type, and calls nothing.
func TestBadCalls(t *testing.T) {
	fc := newFakeCluster(nodeID)
	c := startServer(t, testConfig(t, fc))
	// Just over the cap: the client has written all of it when the
	// plugin stops reading.
	huge := `{"Name": "v1", "Opts": {"x": "` + strings.Repeat("a", 1<<20) + `"}}`
	for _, tc := range []struct {
		name, method, path string
		body               string
		status             int
		want               string
	}{
		{"unknown path", http.MethodPost, "/VolumeDriver.Frobnicate", "{}", http.StatusNotFound, "unknown endpoint"},
		{"wrong method", http.MethodGet, "/VolumeDriver.List", "", http.StatusMethodNotAllowed, "takes POST"},
		{"bad JSON", http.MethodPost, "/VolumeDriver.Create", `{"Name": "v1", "Opts": `, http.StatusInternalServerError, "not the JSON object"},
		{"wrong JSON type", http.MethodPost, "/VolumeDriver.Create", `{"Name": "v1", "Opts": {"size": 16}}`, http.StatusInternalServerError, "not the JSON object"},
		{"oversized body", http.MethodPost, "/VolumeDriver.Create", huge, http.StatusInternalServerError, "larger than"},
		{"no name", http.MethodPost, "/VolumeDriver.Get", `{}`, http.StatusInternalServerError, "Name is required"},
		{"bad name", http.MethodPost, "/VolumeDriver.Create", `{"Name": "../etc"}`, http.StatusInternalServerError, "not a csisupd volume id"},
		{"mount without ID", http.MethodPost, "/VolumeDriver.Mount", `{"Name": "v1"}`, http.StatusInternalServerError, "ID is required"},
		{"mount with a bad ID", http.MethodPost, "/VolumeDriver.Mount", `{"Name": "v1", "ID": "a/b"}`, http.StatusInternalServerError, "workload id"},
		{"unmount with a long ID", http.MethodPost, "/VolumeDriver.Unmount", `{"Name": "v1", "ID": "` + strings.Repeat("a", 128) + `"}`, http.StatusInternalServerError, "workload id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := c.do(tc.method, tc.path, "application/json", []byte(tc.body))
			if a.status != tc.status {
				t.Fatalf("status %d, want %d; body %s", a.status, tc.status, a.body)
			}
			if e := a.errText(t); !strings.Contains(e, tc.want) {
				t.Fatalf("Err %q does not contain %q", e, tc.want)
			}
		})
	}
	if calls := fc.calls(); len(calls) != 0 {
		t.Fatalf("malformed calls reached the cluster: %v", calls)
	}
}
