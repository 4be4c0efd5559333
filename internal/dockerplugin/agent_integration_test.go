package dockerplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// dockerLease is the lease of the agent's Mount claims in
// TestAgentServesDocker: short, so that the claim staying taken for
// longer than it shows that the agent renews it.
const dockerLease = 5 * time.Second

// engine calls a volume plugin socket as an engine does: one POST per
// call, the body JSON.
type engine struct {
	t      *testing.T
	client *http.Client
}

func newEngine(t *testing.T, sock string) *engine {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &engine{t: t, client: &http.Client{Transport: tr, Timeout: time.Minute}}
}

// call posts body to path and decodes the answer into a map; it returns
// the answer's Err ("" when none).
func (e *engine) call(path string, body any) (map[string]any, string) {
	e.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.client.Post("http://plugin"+path, "application/vnd.docker.plugins.v1.2+json", bytes.NewReader(b))
	if err != nil {
		e.t.Fatalf("%s: %v", path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		e.t.Fatalf("%s: decode the answer (HTTP %d): %v", path, resp.StatusCode, err)
	}
	errText, _ := out["Err"].(string)
	if (errText != "") != (resp.StatusCode != http.StatusOK) {
		e.t.Errorf("%s: HTTP %d with Err %q: an error must be a 500 with Err, success a 200 without", path, resp.StatusCode, errText)
	}
	return out, errText
}

// TestAgentServesDocker runs the volume plugin in a real agent of a real
// cluster with the test plugin: Create makes the cluster volume, Mount
// claims it for the container's workload with owner docker and a lease
// the agent renews, a Mount sent again (an engine restarted) returns the
// same claim and publishes nothing again, Remove is refused while the
// claim exists, Unmount frees it, and Remove deletes the volume.
func TestAgentServesDocker(t *testing.T) {
	var sock string
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1, AgentConfig: func(_ int, dir string) string {
		sock = filepath.Join(dir, "docker", "csisupd.sock")
		return fmt.Sprintf("docker {\n  enabled = true\n  socket = %q\n  default_plugin = \"tp\"\n  lease = %q\n}\n", sock, dockerLease)
	}})
	a := c.Agent(0)
	tp := a.StartPlugin("tp", testplugin.Config{})
	control := c.Control(c.WaitForLeader(t, 30*time.Second).Index)
	ctx := context.Background()
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy", func() bool {
		p, err := control.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
	e := newEngine(t, sock)

	if out, errText := e.call("/Plugin.Activate", struct{}{}); errText != "" || fmt.Sprint(out["Implements"]) != "[VolumeDriver]" {
		t.Fatalf("Activate = %v, %q", out, errText)
	}
	if _, errText := e.call("/VolumeDriver.Create", map[string]any{"Name": "v1", "Opts": map[string]string{"size": "16MiB"}}); errText != "" {
		t.Fatalf("Create v1: %s", errText)
	}
	vol, err := control.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"})
	if err != nil || vol.GetVolume().GetPluginId() != "tp" || vol.GetVolume().GetCapacityBytes() < 16<<20 {
		t.Fatalf("volume v1 after Create = %v, %v; want plugin tp, at least 16 MiB", vol.GetVolume(), err)
	}

	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	out, errText := e.call("/VolumeDriver.Mount", map[string]string{"Name": "v1", "ID": id})
	if errText != "" {
		t.Fatalf("Mount v1: %s", errText)
	}
	mountpoint, _ := out["Mountpoint"].(string)
	claim := func() *csisupdv1.VolumeClaim {
		resp, err := control.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"})
		if err != nil {
			t.Fatalf("get v1: %v", err)
		}
		for _, cl := range resp.GetVolume().GetClaims() {
			if cl.GetWorkloadId() == "docker-"+id {
				return cl
			}
		}
		return nil
	}
	cl := claim()
	if cl == nil || cl.GetState() != "taken" || cl.GetOwner() != "docker" || cl.GetNodeId() != a.NodeID() ||
		cl.GetLeaseTtl().AsDuration() != dockerLease || cl.GetHostPath() != mountpoint || mountpoint == "" {
		t.Fatalf("claim after Mount = %v, Mountpoint %q; want taken by docker-%s on %s, owner docker, lease %v, at the Mountpoint", cl, mountpoint, id, a.NodeID(), dockerLease)
	}
	publishes := func() int {
		return len(slices.DeleteFunc(methodsOf(tp), func(m string) bool { return m != "NodePublishVolume" }))
	}
	if n := publishes(); n != 1 {
		t.Fatalf("NodePublishVolume calls after Mount = %d, want 1", n)
	}

	// The agent renews the lease: the claim outlives it twice over.
	testutil.HoldsFor(t, 2*dockerLease, "the claim of a Mount, renewed by the agent", func() bool {
		cl := claim()
		return cl != nil && cl.GetState() == "taken"
	})

	// An engine that restarted sends Mount again: the same claim, nothing
	// published again.
	out, errText = e.call("/VolumeDriver.Mount", map[string]string{"Name": "v1", "ID": id})
	if errText != "" || out["Mountpoint"] != mountpoint {
		t.Fatalf("Mount again = %v, %q; want Mountpoint %q", out, errText, mountpoint)
	}
	if n := publishes(); n != 1 {
		t.Errorf("NodePublishVolume calls after a second Mount = %d, want still 1", n)
	}
	if out, errText := e.call("/VolumeDriver.Get", map[string]string{"Name": "v1"}); errText != "" || !strings.Contains(fmt.Sprint(out["Volume"]), "docker-"+id) {
		t.Errorf("Get v1 = %v, %q; want its Status to carry the claim of docker-%s", out, errText, id)
	}
	if _, errText := e.call("/VolumeDriver.Remove", map[string]string{"Name": "v1"}); !strings.Contains(errText, "docker-"+id) {
		t.Errorf("Remove of a claimed volume: Err %q, want a refusal naming the claim of docker-%s", errText, id)
	}

	if _, errText := e.call("/VolumeDriver.Unmount", map[string]string{"Name": "v1", "ID": id}); errText != "" {
		t.Fatalf("Unmount v1: %s", errText)
	}
	if cl := claim(); cl != nil {
		t.Fatalf("claim after Unmount = %v, want it freed", cl)
	}
	if _, errText := e.call("/VolumeDriver.Remove", map[string]string{"Name": "v1"}); errText != "" {
		t.Fatalf("Remove v1: %s", errText)
	}
	if _, err := control.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"}); err == nil {
		t.Fatal("volume v1 still exists after Remove")
	}
}

// methodsOf lists the methods of p's node log, in order.
func methodsOf(p *testplugin.Plugin) []string {
	var out []string
	for _, c := range p.NodeLog() {
		out = append(out, c.Method)
	}
	return out
}
