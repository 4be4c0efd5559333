package registry

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestLookupPairsRecordAndConnectionOfOneInstance replaces a plugin's socket
// with another instance while callers keep looking the plugin up and
// calling it, as ClientCSI does. The new instance is slow to fingerprint,
// so for a while the record still describes the old instance while the
// supervisor already watches the new one (see lookupAcrossReplacement).
func TestLookupPairsRecordAndConnectionOfOneInstance(t *testing.T) {
	lookupAcrossReplacement(t, testplugin.Faults{Delays: map[string]time.Duration{"GetPluginCapabilities": 1500 * time.Millisecond}}, nil)
}

// TestLookupWithholdsAReplacementNotFingerprinted is the same replacement
// with a new instance whose first fingerprint fails: the record takes the
// new instance over and keeps the old fingerprint, stale, until the new
// one answers. Lookup withholds the connection meanwhile (CI under load
// found calls of the old version's record reaching the new version, when
// the slow fingerprint above timed out).
func TestLookupWithholdsAReplacementNotFingerprinted(t *testing.T) {
	lookupAcrossReplacement(t, testplugin.Faults{Errors: map[string]codes.Code{"GetPluginCapabilities": codes.Unavailable}},
		func(m *Manager, v2 *testplugin.Plugin) {
			testutil.WaitFor(t, 20*time.Second, "the new instance registered, its fingerprint stale", func() bool {
				p, ok := m.Registry().Get("a")
				return ok && p.FingerprintStale
			})
			// Callers look it up in this state until the fingerprint is
			// tried again.
			testutil.WaitFor(t, 20*time.Second, "a second fingerprint of the new instance", func() bool {
				return v2.Stats().Calls["GetPluginCapabilities"] >= 2
			})
			v2.SetFaults(testplugin.Faults{})
		})
}

// lookupAcrossReplacement replaces plugin "a" (version 1.0.0) with
// version 2.0.0, whose faults are faults, while callers keep looking it up
// and calling it, as ClientCSI does; between, when not nil, runs after the
// new socket took the path over. Whatever answers a call made on the
// connection Lookup returned must be the instance the record returned
// with it describes: never the new instance with the old one's
// capabilities, nor the reverse. Run it with -race.
func lookupAcrossReplacement(t *testing.T, faults testplugin.Faults, between func(m *Manager, v2 *testplugin.Plugin)) {
	t.Helper()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a.sock")
	startPlugin(t, sock, testplugin.Config{VendorVersion: "1.0.0"})
	m := startManager(t, ManagerConfig{PluginDir: dir})
	testutil.WaitFor(t, 10*time.Second, "version 1.0.0 registered, healthy and answering", func() bool {
		p, c, ok := m.Lookup("a")
		if !ok || c == nil || !p.GetHealthy() || p.GetVendorVersion() != "1.0.0" {
			return false
		}
		// Connected before the replacement, as a busy ClientCSI is.
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer ccancel()
		_, err := c.Identity.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		return err == nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mismatches, answered, withheld atomic.Int64
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				p, c, ok := m.Lookup("a")
				if !ok {
					continue
				}
				if c == nil {
					withheld.Add(1)
					continue
				}
				cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
				info, err := c.Identity.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
				ccancel()
				if err != nil {
					continue // the old instance's connection closed under the call
				}
				answered.Add(1)
				if info.GetVendorVersion() != p.GetVendorVersion() {
					mismatches.Add(1)
					t.Errorf("the connection of the record of version %s reached version %s",
						p.GetVendorVersion(), info.GetVendorVersion())
				}
			}
		})
	}

	testutil.WaitFor(t, 10*time.Second, "calls answered by the old instance", func() bool { return answered.Load() > 0 })

	// The new instance listens elsewhere, then takes the path over; the
	// old one keeps serving its open connections.
	next := filepath.Join(testutil.TempDir(t), "next.sock")
	v2 := newPlugin(t, next, testplugin.Config{VendorVersion: "2.0.0"})
	v2.SetFaults(faults)
	if err := v2.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, sock); err != nil {
		t.Fatal(err)
	}
	if between != nil {
		between(m, v2)
	}
	testutil.WaitFor(t, 20*time.Second, "version 2.0.0 registered", func() bool {
		p, c, ok := m.Lookup("a")
		return ok && c != nil && p.GetVendorVersion() == "2.0.0"
	})
	before := answered.Load()
	testutil.WaitFor(t, 10*time.Second, "calls answered by the new instance", func() bool { return answered.Load() > before })
	cancel()
	wg.Wait()

	if mismatches.Load() > 0 {
		t.Fatalf("%d of %d answered calls reached another instance than their record's", mismatches.Load(), answered.Load())
	}
	if withheld.Load() == 0 {
		t.Error("no lookup fell between the two instances; the test did not exercise the replacement")
	}
	t.Logf("%d calls answered, %d lookups without a connection during the replacement", answered.Load(), withheld.Load())
}

// TestCheckInstance is the check ClientCSI's connection of a supervisor
// runs after each connect: it passes while the socket at the path is the
// supervised instance and fails, saying so, once another plugin replaced it
// or it is gone.
func TestCheckInstance(t *testing.T) {
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a.sock")
	startPlugin(t, sock, testplugin.Config{VendorVersion: "1.0.0"})
	v1 := statSocket(t, sock)
	if err := checkInstance(v1); err != nil {
		t.Fatalf("checkInstance of the socket itself: %v", err)
	}

	next := filepath.Join(dir, "next.sock")
	startPlugin(t, next, testplugin.Config{VendorVersion: "2.0.0"})
	if err := os.Rename(next, sock); err != nil {
		t.Fatal(err)
	}
	if err := checkInstance(v1); !errors.Is(err, errSocketReplaced) {
		t.Errorf("checkInstance after the socket was replaced = %v, want %v", err, errSocketReplaced)
	}
	if err := checkInstance(statSocket(t, sock)); err != nil {
		t.Errorf("checkInstance of the new socket: %v", err)
	}

	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := checkInstance(v1); err == nil || !strings.Contains(err.Error(), sock) {
		t.Errorf("checkInstance of a removed socket = %v, want an error naming it", err)
	}
}
