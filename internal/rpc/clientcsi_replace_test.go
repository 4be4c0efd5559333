package rpc

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestClientCSISocketReplacedDuringCalls replaces a controller plugin's
// socket with a new instance that has other capabilities while ClientCSI
// calls keep arriving. Version 1 advertises only GET_CAPACITY, version 2
// only LIST_VOLUMES, and version 2 is slow to fingerprint (within the
// probe timeout of newManagedEnv), so for a while
// the registry's record still describes version 1 while its supervisor
// already watches version 2. ClientCSI decides from the record whether a
// method is allowed, so a GetCapacity reaching version 2 was decided with
// version 1's capabilities and sent on version 2's connection, and a
// ListVolumes reaching version 1 the reverse. Neither may happen. Run it
// with -race.
func TestClientCSISocketReplacedDuringCalls(t *testing.T) {
	env := newManagedEnv(t, "ctl", testplugin.Config{
		VendorVersion:          "1.0.0",
		ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_GET_CAPACITY},
	}, ClientCSIConfig{}, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	call := func(f func(context.Context) error) {
		wg.Go(func() {
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				_ = f(cctx) // refusals while the plugin changes are expected; what reached whom is checked below
				ccancel()
			}
		})
	}
	for range 2 {
		call(func(ctx context.Context) error {
			_, err := env.client.ControllerGetCapacity(ctx, &csisupdv1.ControllerGetCapacityRequest{
				PluginId: "ctl", Request: &csi.GetCapacityRequest{}})
			return err
		})
		call(func(ctx context.Context) error {
			_, err := env.client.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{
				PluginId: "ctl", Request: &csi.ListVolumesRequest{}})
			return err
		})
	}
	testutil.WaitFor(t, 10*time.Second, "GetCapacity calls to reach version 1", func() bool {
		return env.plugin.Stats().Calls["GetCapacity"] > 0
	})

	// Version 2 listens elsewhere, then takes the path over; version 1
	// keeps serving the connections it has.
	next := filepath.Join(testutil.TempDir(t), "next.sock")
	v2, err := testplugin.New(testplugin.Config{
		Socket:                 next,
		StateDir:               testutil.TempDir(t),
		VendorVersion:          "2.0.0",
		ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_LIST_VOLUMES},
	})
	if err != nil {
		t.Fatal(err)
	}
	v2.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"GetPluginCapabilities": 150 * time.Millisecond}})
	if err := v2.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v2.Stop)
	if err := os.Rename(next, env.plugin.Socket()); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "ListVolumes calls to reach version 2", func() bool {
		return v2.Stats().Calls["ListVolumes"] > 0
	})
	cancel()
	wg.Wait()

	if n := v2.Stats().Calls["GetCapacity"]; n > 0 {
		t.Errorf("%d GetCapacity calls, allowed by version 1's capabilities, reached version 2", n)
	}
	if n := env.plugin.Stats().Calls["ListVolumes"]; n > 0 {
		t.Errorf("%d ListVolumes calls, allowed by version 2's capabilities, reached version 1", n)
	}
}
