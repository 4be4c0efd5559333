package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// secretToken is the test plugin's required secret; it must show in no
// log line.
const secretToken = "agent-secrets-file-token-9c1"

// writeSecrets writes a secrets file with mode.
func writeSecrets(t *testing.T, path, src string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(src), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func TestSecretsFileReachesEveryCall(t *testing.T) {
	cfg := testConfig(t)
	startPluginWith(t, cfg, "p1", testplugin.Config{RequiredSecrets: map[string]string{"token": secretToken}})
	secretsPath := filepath.Join(filepath.Dir(cfg.DataDir), "p1.hcl")
	writeSecrets(t, secretsPath, "default {\n  token = \""+secretToken+"\"\n}\n", 0o600)
	cfg.Plugins = map[string]config.PluginConfig{"p1": {SecretsFile: secretsPath, HealthTimeout: config.DefaultPluginHealthTimeout}}
	logs := &testutil.SyncBuffer{}
	a, err := New(Config{Config: cfg, Logger: hclog.NewInterceptLogger(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace})})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	waitHealthy(t, a, "p1")

	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clientCSI := csisupdv1.NewClientCSIClient(conn)
	var created string
	create := func(name string) error {
		resp, err := clientCSI.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: "p1",
			Request: &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{{
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}}}})
		created = resp.GetResponse().GetVolume().GetVolumeId()
		return err
	}
	// ClientCSI and the node volumes both carry the file's secret.
	if err := create("v1"); err != nil {
		t.Fatalf("ControllerCreateVolume without secrets of its own: %v", err)
	}
	if _, err := a.volumes.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "p1", VolumeId: "v1", ExternalId: created, WorkloadId: "w1"}); err != nil {
		t.Fatalf("Mount: %v", err)
	}

	// A file open to others keeps the secrets read before...
	writeSecrets(t, secretsPath, "default {\n  token = \"changed\"\n}\n", 0o644)
	err = a.Reload(cfg)
	if err == nil || !strings.Contains(err.Error(), secretsPath) || !strings.Contains(err.Error(), "chmod 0600") {
		t.Fatalf("Reload with a 0644 secrets file = %v, want an error naming the file and the fix", err)
	}
	if err := create("v2"); err != nil {
		t.Fatalf("after a refused file, the old secrets must stay: %v", err)
	}
	// ...and a removed one drops them: the plugin refuses.
	if err := os.Remove(secretsPath); err != nil {
		t.Fatal(err)
	}
	_ = a.Reload(cfg)
	if err := create("v3"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("after the file was removed: %v, want the plugin's Unauthenticated", err)
	}
	if _, err := a.volumes.Unmount(ctx, &csisupdv1.UnmountVolumeRequest{PluginId: "p1", VolumeId: "v1", WorkloadId: "w1"}); err != nil {
		t.Fatalf("Unmount (its calls carry no secrets): %v", err)
	}
	if strings.Contains(logs.String(), secretToken) {
		t.Error("the agent's log shows the secret")
	}
}

func TestNewRefusesAnOpenSecretsFile(t *testing.T) {
	cfg := testConfig(t)
	secretsPath := filepath.Join(filepath.Dir(cfg.DataDir), "p1.hcl")
	writeSecrets(t, secretsPath, "default {\n  token = \""+secretToken+"\"\n}\n", 0o640)
	cfg.Plugins = map[string]config.PluginConfig{"p1": {SecretsFile: secretsPath, HealthTimeout: config.DefaultPluginHealthTimeout}}
	_, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err == nil || !strings.Contains(err.Error(), secretsPath) || !strings.Contains(err.Error(), "mode 0640") {
		t.Fatalf("New = %v, want an error naming the file and its mode", err)
	}
	if strings.Contains(err.Error(), secretToken) {
		t.Error("the error shows the secret")
	}
}
