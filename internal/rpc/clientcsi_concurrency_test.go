package rpc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

var mountCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
}

// createVolume creates a volume through ClientCSI and returns its id.
func createVolume(t testing.TB, c csisupdv1.ClientCSIClient, plugin, name string) string {
	t.Helper()
	resp, err := c.ControllerCreateVolume(context.Background(), &csisupdv1.ControllerCreateVolumeRequest{
		PluginId: plugin,
		Request:  &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{mountCap}},
	})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return resp.GetResponse().GetVolume().GetVolumeId()
}

func TestClientCSIDestructiveCallsSerialised(t *testing.T) {
	const callers = 64
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprintf("max_destructive_in_flight=%d", limit), func(t *testing.T) {
			env := newManagedEnv(t, "p1",
				testplugin.Config{NodeID: "node-0", KnownNodeIDs: []string{testplugin.AnyNode}},
				ClientCSIConfig{MaxDestructiveInFlight: limit}, nil)
			vol := createVolume(t, env.client, "p1", "vol")
			env.plugin.ResetStats()
			// A short delay keeps every call in flight long enough for the
			// others to pile up behind it.
			env.plugin.SetFaults(testplugin.Faults{PublishDelay: 2 * time.Millisecond})

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for i := range callers {
				wg.Go(func() {
					_, err := env.client.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{
						PluginId: "p1",
						Request: &csi.ControllerPublishVolumeRequest{
							VolumeId:         vol,
							NodeId:           fmt.Sprintf("node-%d", i),
							VolumeCapability: mountCap,
						},
					})
					if err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("attach: %v", err)
			}
			st := env.plugin.Stats()
			if n := st.Calls["ControllerPublishVolume"]; n != callers {
				t.Errorf("the plugin saw %d ControllerPublishVolume calls, want %d", n, callers)
			}
			if n := st.MaxInFlight["ControllerPublishVolume"]; n < 1 || n > int64(limit) {
				t.Errorf("the plugin saw up to %d ControllerPublishVolume calls in flight, want 1..%d", n, limit)
			}
		})
	}
}

func TestClientCSIReadsNotSerialised(t *testing.T) {
	const readers = 8
	env := newManagedEnv(t, "p1", testplugin.Config{}, ClientCSIConfig{}, nil)
	// Every ListVolumes hangs until its caller gives up. Reads that were
	// serialised could never have more than one in flight.
	env.plugin.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"ListVolumes": time.Hour}})
	env.plugin.ResetStats()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, readers)
	for range readers {
		wg.Go(func() {
			_, err := env.client.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: "p1"})
			codesSeen <- status.Code(err)
		})
	}
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("%d ListVolumes calls in flight at the plugin", readers), func() bool {
		return env.plugin.Stats().InFlight["ListVolumes"] == readers
	})
	// A destructive call is not held up by reads either.
	vol := createVolume(t, env.client, "p1", "during-reads")
	if vol == "" {
		t.Error("CreateVolume during reads returned no volume id")
	}
	cancel()
	wg.Wait()
	close(codesSeen)
	for c := range codesSeen {
		if c != codes.Canceled {
			t.Errorf("ListVolumes ended with %s, want Canceled", c)
		}
	}
}

func TestClientCSIDestructiveWaitHonoursDeadline(t *testing.T) {
	env := newManagedEnv(t, "p1", testplugin.Config{}, ClientCSIConfig{}, nil)
	env.plugin.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"CreateVolume": time.Hour}})

	// The first create holds the plugin's only destructive slot.
	holdCtx, release := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := env.client.ControllerCreateVolume(holdCtx, &csisupdv1.ControllerCreateVolumeRequest{
			PluginId: "p1", Request: &csi.CreateVolumeRequest{Name: "slow", VolumeCapabilities: []*csi.VolumeCapability{mountCap}},
		})
		held <- err
	}()
	testutil.WaitFor(t, 20*time.Second, "the first CreateVolume to reach the plugin", func() bool {
		return env.plugin.Stats().InFlight["CreateVolume"] == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := env.client.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{
		PluginId: "p1", Request: &csi.DeleteVolumeRequest{VolumeId: "whatever"},
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("queued DeleteVolume: error = %v, want DeadlineExceeded", err)
	}
	if n := env.plugin.Stats().Calls["DeleteVolume"]; n != 0 {
		t.Errorf("the plugin saw %d DeleteVolume calls while the slot was held, want 0", n)
	}
	release()
	if err := <-held; status.Code(err) != codes.Canceled {
		t.Errorf("held CreateVolume: error = %v, want Canceled", err)
	}
}
