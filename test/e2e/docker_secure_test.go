package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// pluginCall posts body to path on the volume plugin socket sock, as an
// engine does, and returns the answer decoded and its Err ("" when none).
// A 200 must carry no Err, an error must be a 500 with one.
func pluginCall(t *testing.T, sock, path string, body any) (map[string]any, string) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	defer tr.CloseIdleConnections()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Post("http://plugin"+path, "application/vnd.docker.plugins.v1.2+json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s on %s: %v", path, sock, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: decode the answer (HTTP %d): %v", path, resp.StatusCode, err)
	}
	errText, _ := out["Err"].(string)
	if (errText != "") != (resp.StatusCode != http.StatusOK) {
		t.Errorf("%s: HTTP %d with Err %q", path, resp.StatusCode, errText)
	}
	return out, errText
}

// TestDockerPluginWithTLSAndACLs runs the volume plugin on an agent of a
// TLS + ACL cluster with tls.verify_node_name, whose token has node-1's
// identity and the policy deploy/acl/docker-agent.hcl, as the README
// sets it up. The agent makes the plugin's calls with its own client
// certificate and token: Create, Mount, Unmount and Remove work. The same
// credentials cannot claim for another node, nor force a release.
func TestDockerPluginWithTLSAndACLs(t *testing.T) {
	p := pki{dir: testutil.TempDir(t)}
	p.tls(t, "ca", "create")
	for range 3 {
		p.tls(t, "cert", "create", "--server")
	}
	p.tls(t, "cert", "create", "--client", "--node", "node-1")
	p.tls(t, "cert", "create", "--cli")
	const verify = "  verify_node_name = true\n"
	servers := startSecureClusterTLS(t, p, "", verify)
	addr := servers[0].rpc
	mgmt := bootstrapACL(t, p, addr)
	policy, err := filepath.Abs("../../deploy/acl/docker-agent.hcl")
	if err != nil {
		t.Fatal(err)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "policy", "apply", "docker-agent", policy); res.code != 0 {
		t.Fatalf("acl policy apply docker-agent: exit %d: %s", res.code, res.stderr)
	}
	var tok tokenDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &tok, "acl", "token", "create", "--name", "node-1", "--node-identity", "node-1", "--policy", "docker-agent")
	sock := filepath.Join(testutil.TempDir(t), "csisupd.sock")
	docker := fmt.Sprintf("docker {\n  enabled = true\n  socket = %q\n  default_plugin = \"tp\"\n}\n", sock)
	startSecureAgentTLS(t, p, servers, "node-1", "", tok.SecretID, p.tlsBlockWith("client", 0, verify)+docker)
	testutil.WaitFor(t, 60*time.Second, "plugin tp healthy on node-1", func() bool {
		var doc pluginDoc
		res := secureCLI(t, p, addr, mgmt.SecretID, "plugin", "status", "tp", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.NodesHealthy == 1
	})

	if _, errText := pluginCall(t, sock, "/VolumeDriver.Create", map[string]any{"Name": "v1", "Opts": map[string]string{"size": "16MiB"}}); errText != "" {
		t.Fatalf("Create v1 with the agent's credentials: %s", errText)
	}
	const id = "c0ffee"
	out, errText := pluginCall(t, sock, "/VolumeDriver.Mount", map[string]string{"Name": "v1", "ID": id})
	if errText != "" || out["Mountpoint"] == "" {
		t.Fatalf("Mount v1 with the agent's credentials: %v, %s", out, errText)
	}
	var vol struct {
		Claims []struct {
			WorkloadID string `json:"workload_id"`
			Owner      string `json:"owner"`
			State      string `json:"state"`
		} `json:"claims"`
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &vol, "volume", "status", "v1")
	if len(vol.Claims) != 1 || vol.Claims[0].WorkloadID != "docker-"+id || vol.Claims[0].Owner != "docker" || vol.Claims[0].State != "taken" {
		t.Fatalf("claims of v1 after Mount: %+v; want one taken by docker-%s, owner docker", vol.Claims, id)
	}

	// The agent's credentials, used from elsewhere: they act for node-1
	// only, and never force.
	cfg := p.clientTLS(t, "client")
	certFile, keyFile := p.cert("client", 0)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(withServerName(cfg, "localhost"))),
		grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: tok.SecretID}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	control := csisupdv1.NewControlClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = control.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "v1", NodeId: "node-2", WorkloadId: "w", LeaseTtl: durationpb.New(time.Minute)})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `bound to node "node-1", not "node-2"`) {
		t.Errorf("a claim for node-2 with node-1's credentials: %v; want PermissionDenied naming the binding", err)
	}
	_, err = control.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "v1", NodeId: "node-1", WorkloadId: "docker-" + id, Force: 2})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "(forced)") {
		t.Errorf("a forced release with the docker agent's credentials: %v; want PermissionDenied for the forced release", err)
	}

	if _, errText := pluginCall(t, sock, "/VolumeDriver.Unmount", map[string]string{"Name": "v1", "ID": id}); errText != "" {
		t.Fatalf("Unmount v1: %s", errText)
	}
	if _, errText := pluginCall(t, sock, "/VolumeDriver.Remove", map[string]string{"Name": "v1"}); errText != "" {
		t.Fatalf("Remove v1: %s", errText)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "volume", "status", "v1"); res.code == 0 {
		t.Errorf("volume v1 still exists after Remove: %s", res.stdout)
	}
}
