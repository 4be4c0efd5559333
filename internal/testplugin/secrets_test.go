package testplugin

import (
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestRequiredSecrets(t *testing.T) {
	const token = "tok-only-in-the-file"
	p := startPlugin(t, Config{Type: TypeMonolith, RequiredSecrets: map[string]string{"token": token}})
	c := dial(t, p.cfg.Socket)
	create := func(secrets map[string]string) error {
		_, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "v1", Secrets: secrets,
			VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
		return err
	}
	for _, bad := range []map[string]string{nil, {"token": "other"}, {"user": token}} {
		err := create(bad)
		wantCode(t, err, codes.Unauthenticated)
		if !strings.Contains(err.Error(), `"token"`) || strings.Contains(err.Error(), token) || strings.Contains(err.Error(), "other") {
			t.Errorf("refusal %q must name the key and no value", err)
		}
	}
	if err := create(map[string]string{"token": token, "extra": "x"}); err != nil {
		t.Fatalf("CreateVolume with the secret: %v", err)
	}
	// A call that cannot carry secrets is served.
	if _, err := c.node.NodeGetInfo(ctx(t), &csi.NodeGetInfoRequest{}); err != nil {
		t.Errorf("NodeGetInfo: %v", err)
	}
	if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: "v1"}); err == nil {
		t.Error("DeleteVolume without the secret was served")
	}
}
