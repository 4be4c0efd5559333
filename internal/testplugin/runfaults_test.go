package testplugin

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// TestSlowMode checks that slow mode delays Node and Controller calls
// and not Identity calls, that a call whose caller gave up during the
// wait still acts, and that 0 turns it off.
func TestSlowMode(t *testing.T) {
	p, c, path := journalPlugin(t)
	// Calls that must not wait get half of d as their deadline: a
	// deadline, not a timing, decides.
	const d = 2 * time.Second
	p.SetSlow(d)
	within := func(f func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(context.Background(), d/2)
		defer cancel()
		return f(cctx)
	}

	if err := within(func(cctx context.Context) error {
		_, err := c.id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		return err
	}); err != nil {
		t.Fatalf("an Identity call in slow mode: %v", err)
	}
	start := time.Now()
	if _, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "slow", VolumeCapabilities: []*csi.VolumeCapability{snw}}); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got < d {
		t.Errorf("CreateVolume took %s in slow mode, want at least %s", got, d)
	}

	// The caller gives up during the wait; the volume is made anyway.
	short, cancel := context.WithTimeout(context.Background(), d/4)
	defer cancel()
	if _, err := c.ctrl.CreateVolume(short, &csi.CreateVolumeRequest{Name: "late", VolumeCapabilities: []*csi.VolumeCapability{snw}}); err == nil {
		t.Fatal("a CreateVolume whose caller gave up answered")
	}
	waitJournal(t, path, func(recs []JournalRecord) bool {
		for _, r := range recs {
			if r.Method == "CreateVolume" && r.Name == "late" && r.Phase == JournalEnd && r.Code == "OK" {
				return true
			}
		}
		return false
	})
	p.SetSlow(0)
	if err := within(func(cctx context.Context) error {
		_, err := c.node.NodeGetCapabilities(cctx, &csi.NodeGetCapabilitiesRequest{})
		return err
	}); err != nil {
		t.Fatalf("a call after slow mode was turned off: %v", err)
	}
}

// TestArmCrash checks that an armed crash happens in the next mutating
// call after its work and before its end record, once.
func TestArmCrash(t *testing.T) {
	var crashes atomic.Int32
	path := filepath.Join(t.TempDir(), "journal", "calls.jsonl")
	p := startPlugin(t, Config{Journal: path, Name: "crash.test", Crash: func() { crashes.Add(1) }})
	c := dial(t, p.Socket())

	p.ArmCrash()
	// Not mutating: no crash.
	if _, err := c.node.NodeGetCapabilities(ctx(t), &csi.NodeGetCapabilitiesRequest{}); err != nil {
		t.Fatal(err)
	}
	if crashes.Load() != 0 {
		t.Fatal("a NodeGetCapabilities call crashed")
	}
	// In process, Crash returns and the call goes on: the test sees
	// where it was called from the journal and the state.
	vol, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "crashed", VolumeCapabilities: []*csi.VolumeCapability{snw}})
	if err != nil {
		t.Fatal(err)
	}
	if crashes.Load() != 1 {
		t.Fatalf("crashes = %d after the armed CreateVolume, want 1", crashes.Load())
	}
	if _, ok := p.Volume(vol.GetVolume().GetVolumeId()); !ok {
		t.Error("the crashed CreateVolume's volume is not in the plugin's state")
	}
	if _, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "after", VolumeCapabilities: []*csi.VolumeCapability{snw}}); err != nil {
		t.Fatal(err)
	}
	if crashes.Load() != 1 {
		t.Fatalf("crashes = %d after a second CreateVolume, want 1: one crash per arming", crashes.Load())
	}
}

// TestArmCrashBeforeEndRecord checks the journal of a crash: the begin
// record of the crashed call is written, its end record only after
// Crash returned (never, when the process exits).
func TestArmCrashBeforeEndRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal", "calls.jsonl")
	var endsAtCrash int
	p := startPlugin(t, Config{Journal: path, Name: "crash.test", Crash: func() {
		for _, r := range readJournal(t, path) {
			if r.Method == "CreateVolume" && r.Phase == JournalEnd {
				endsAtCrash++
			}
		}
	}})
	c := dial(t, p.Socket())
	p.ArmCrash()
	if _, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "crashed", VolumeCapabilities: []*csi.VolumeCapability{snw}}); err != nil {
		t.Fatal(err)
	}
	if endsAtCrash != 0 {
		t.Errorf("the journal held %d CreateVolume end records when the call crashed, want 0", endsAtCrash)
	}
}

// waitJournal waits until cond holds for the journal at path.
func waitJournal(t *testing.T, path string, cond func([]JournalRecord) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond(readJournal(t, path)) {
		if time.Now().After(deadline) {
			t.Fatalf("journal %s: condition not met within 10s: %+v", path, readJournal(t, path))
		}
		<-tick.C
	}
}
