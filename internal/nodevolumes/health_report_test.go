package nodevolumes

import (
	"context"
	"sync"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// healthReports records the reports of a Manager's health loop.
type healthReports struct {
	mu      sync.Mutex
	reports []string
}

func (h *healthReports) report(_ context.Context, volumeID string, abnormal bool, message string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := volumeID + " normal"
	if abnormal {
		s = volumeID + " abnormal " + message
	}
	h.reports = append(h.reports, s)
	return nil
}

func (h *healthReports) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.reports...)
}

// TestHealthLoopReportsChanges mounts a cluster volume of a plugin with
// GET_VOLUME_HEALTH: the loop reports it once, then only its changes,
// however often it asks.
func TestHealthLoopReportsChanges(t *testing.T) {
	e := newEnv(t, Config{}, false)
	hp := startPluginWith(t, e.dir, "hp", testplugin.Config{Type: testplugin.TypeNode, VolumeHealth: true})
	model := nodeModel("hp")
	model.NodeCapabilities = append(model.NodeCapabilities, plugin.CapGetVolumeHealth)
	e.plugins.set(model, hp.client)
	h := &healthReports{}
	m := e.manager(t, Config{HealthReport: h.report, HealthInterval: 10e6}, true) // 10 ms
	if _, err := m.Mount(context.Background(), &csisupdv1.MountVolumeRequest{PluginId: "hp", VolumeId: "v1", WorkloadId: "w1", Cluster: true}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitTime, "the first report", func() bool { return len(h.all()) == 1 })
	if got := h.all()[0]; got != "v1 normal" {
		t.Fatalf("first report %q, want v1 normal", got)
	}
	asked := hp.calls("NodeGetVolumeHealth")
	testutil.WaitFor(t, waitTime, "five more rounds", func() bool { return hp.calls("NodeGetVolumeHealth") >= asked+5 })
	if n := len(h.all()); n != 1 {
		t.Fatalf("reports in a steady state: %v", h.all())
	}
	hp.SetVolumeCondition("v1", true, "bad sectors")
	testutil.WaitFor(t, waitTime, "the abnormal report", func() bool { return len(h.all()) == 2 })
	if got := h.all()[1]; got != "v1 abnormal DEGRADED Abnormal: bad sectors" {
		t.Errorf("second report %q", got)
	}
	hp.SetVolumeCondition("v1", false, "")
	testutil.WaitFor(t, waitTime, "the normal report", func() bool { return len(h.all()) == 3 })
	if got := h.all()[2]; got != "v1 normal" {
		t.Errorf("third report %q", got)
	}
}
