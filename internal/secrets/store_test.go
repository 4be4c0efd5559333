package secrets

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/csisupd/csisupd/internal/testutil"
)

const classFile = `default {
  token = "` + marker + `"
  user  = "default"
}
controller   { user = "controller" }
node_stage   { user = "node_stage" }
node_publish { user = "node_publish" }
node_expand  { user = "node_expand" }
snapshot     { user = "snapshot" }
`

func TestApplyByClass(t *testing.T) {
	f, err := Parse("f.hcl", []byte(classFile))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		req  proto.Message
		user string // "" when the request has no secrets field
	}{
		{&csi.CreateVolumeRequest{}, "controller"},
		{&csi.DeleteVolumeRequest{}, "controller"},
		{&csi.ControllerPublishVolumeRequest{}, "controller"},
		{&csi.ControllerUnpublishVolumeRequest{}, "controller"},
		{&csi.ValidateVolumeCapabilitiesRequest{}, "controller"},
		{&csi.ControllerExpandVolumeRequest{}, "controller"},
		{&csi.ControllerModifyVolumeRequest{}, "controller"},
		{&csi.CreateSnapshotRequest{}, "snapshot"},
		{&csi.DeleteSnapshotRequest{}, "snapshot"},
		{&csi.ListSnapshotsRequest{}, "snapshot"},
		{&csi.GetSnapshotRequest{}, "snapshot"},
		{&csi.NodeStageVolumeRequest{}, "node_stage"},
		{&csi.NodePublishVolumeRequest{}, "node_publish"},
		{&csi.NodeExpandVolumeRequest{}, "node_expand"},
		{&csi.NodeUnpublishVolumeRequest{}, ""},
		{&csi.NodeUnstageVolumeRequest{}, ""},
		{&csi.ListVolumesRequest{}, ""},
		{&csi.GetCapacityRequest{}, ""},
	}
	for _, tt := range tests {
		name := string(tt.req.ProtoReflect().Descriptor().Name())
		t.Run(name, func(t *testing.T) {
			has := merge(tt.req, f)
			got := secretsOf(tt.req)
			if tt.user == "" {
				if has || len(got) != 0 {
					t.Fatalf("merge into a request without secrets: has=%v, got %d keys", has, len(got))
				}
				return
			}
			if got["user"] != tt.user || got["token"] != marker {
				t.Errorf("secrets: user=%q, token set=%v; want user=%q and the default token", got["user"], got["token"] == marker, tt.user)
			}
		})
	}
}

func TestApplyKeepsTheCallsSecrets(t *testing.T) {
	f, err := Parse("f.hcl", []byte(classFile))
	if err != nil {
		t.Fatal(err)
	}
	req := &csi.ControllerUnpublishVolumeRequest{Secrets: map[string]string{"user": "caller", "extra": "x"}}
	merge(req, f)
	want := map[string]string{"user": "caller", "extra": "x", "token": marker}
	if len(req.GetSecrets()) != len(want) {
		t.Fatalf("secrets have %d keys, want %d", len(req.GetSecrets()), len(want))
	}
	for k, v := range want {
		if req.GetSecrets()[k] != v {
			t.Errorf("secrets[%s] is not the %s value", k, map[bool]string{true: "caller's", false: "file's"}[k != "token"])
		}
	}
}

// secretsOf returns the request's secrets field, or nil.
func secretsOf(m proto.Message) map[string]string {
	fd, ok := secretsField(m.ProtoReflect())
	if !ok {
		return nil
	}
	out := map[string]string{}
	m.ProtoReflect().Get(fd).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		out[k.String()] = v.String()
		return true
	})
	return out
}

func TestStoreLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.hcl")
	write := func(src string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	token := func(s *Store) string {
		req := &csi.NodeStageVolumeRequest{}
		s.Apply("p", req)
		return req.GetSecrets()["token"]
	}
	logs := &testutil.SyncBuffer{}
	s := NewStore(hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace}))

	write(`default { token = "` + marker + `" }`)
	if err := s.Load(map[string]string{"p": path}); err != nil {
		t.Fatal(err)
	}
	if token(s) != marker || !s.Has("p") {
		t.Fatal("the file's token is not applied")
	}

	// A bad file keeps the secrets read before, and the error names it.
	write(`default { token = `)
	err := s.Load(map[string]string{"p": path})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load of a bad file = %v, want an error naming %s", err, path)
	}
	if token(s) != marker {
		t.Error("a bad file dropped the secrets read before")
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Load(map[string]string{"p": path}); err == nil || token(s) != marker {
		t.Errorf("a file open to others: error %v, token kept %v; want an error and the old token", err, token(s) == marker)
	}

	// A removed file means no secrets from it.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Load(map[string]string{"p": path}); err == nil {
		t.Error("Load of a missing file succeeded")
	}
	if token(s) != "" || s.Has("p") {
		t.Error("a removed file's secrets are still applied")
	}

	// A plugin no longer configured has none either.
	write(`default { token = "` + marker + `" }`)
	if err := s.Load(map[string]string{"p": path}); err != nil {
		t.Fatal(err)
	}
	if err := s.Load(nil); err != nil {
		t.Fatal(err)
	}
	if token(s) != "" {
		t.Error("a plugin no longer configured keeps its secrets")
	}
	// Other plugins are left alone, and nil stores apply nothing.
	req := &csi.NodeStageVolumeRequest{}
	s.Apply("other", req)
	var none *Store
	none.Apply("p", req)
	if len(req.GetSecrets()) != 0 {
		t.Error("secrets applied to a plugin without a file")
	}
	if strings.Contains(logs.String(), marker) {
		t.Error("the log shows a secret value")
	}
	if !strings.Contains(logs.String(), "token") {
		t.Error("the log does not name the file's keys")
	}
}
