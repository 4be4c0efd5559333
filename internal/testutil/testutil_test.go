package testutil

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFreePortsDistinct(t *testing.T) {
	ports := FreePorts(t, 20)
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: %d repeated or invalid", ports, p)
		}
		seen[p] = true
	}
}

func TestTempDirShortAndRemoved(t *testing.T) {
	var dir string
	t.Run("inner", func(t *testing.T) {
		dir = TempDir(t)
		if len(dir)+len("/plugin-id/csi.sock") > 100 {
			t.Errorf("temp dir %q too long for unix sockets", dir)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s not removed after the test: %v", dir, err)
	}
}

func TestWaitFor(t *testing.T) {
	n := 0
	WaitFor(t, 5*time.Second, "three checks", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("cond checked %d times, want 3", n)
	}
}

func TestSyncBufferConcurrent(t *testing.T) {
	var b SyncBuffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { fmt.Fprintf(&b, "line %d\n", i) })
	}
	wg.Wait()
	if got := len(b.String()); got != 8*len("line 0\n") {
		t.Fatalf("buffer holds %d bytes", got)
	}
}

func TestFreePortsOutsideEphemeralRange(t *testing.T) {
	low, high := ephemeralPortRange()
	if portPicker(low, high) == nil {
		t.Skipf("ephemeral range %d-%d leaves too few ports outside it", low, high)
	}
	for _, p := range FreePorts(t, 50) {
		if p >= low && p <= high {
			t.Errorf("port %d lies in the ephemeral range %d-%d", p, low, high)
		}
	}
}

func TestPortPicker(t *testing.T) {
	tests := []struct {
		name      string
		low, high int
		wantNil   bool
	}{
		{"linux default", 32768, 60999, false},
		{"only above", 1024, 50000, false},
		{"only below", 40000, 65535, false},
		{"whole range", 1024, 65535, true},
		{"too narrow outside", 10400, 65200, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pick := portPicker(tt.low, tt.high)
			if (pick == nil) != tt.wantNil {
				t.Fatalf("portPicker(%d, %d) nil = %v, want %v", tt.low, tt.high, pick == nil, tt.wantNil)
			}
			for range 1000 {
				if pick == nil {
					break
				}
				p := pick()
				if (p >= tt.low && p <= tt.high) || p < lowestPort || p > 65535 {
					t.Fatalf("picked %d, want in [%d, 65535] outside [%d, %d]", p, lowestPort, tt.low, tt.high)
				}
			}
		})
	}
}

func TestFreeAddrBindable(t *testing.T) {
	addr := FreeAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("FreeAddr %s: %v", addr, err)
	}
	ln.Close()
}

func TestPortClaimHoldsAgainstOtherClaimers(t *testing.T) {
	dir := t.TempDir()
	// Two claimers on one directory stand for two test processes: flock
	// locks of two open files conflict even within one process.
	first, second := newPortClaimer(dir), newPortClaimer(dir)
	const port = 20001
	if ok, err := first.claim(port); !ok || err != nil {
		t.Fatalf("first claim of %d: ok %v, err %v", port, ok, err)
	}
	if ok, err := first.claim(port); ok || err != nil {
		t.Fatalf("second claim of %d in the same claimer: ok %v, err %v; want refused", port, ok, err)
	}
	if ok, err := second.claim(port); ok || err != nil {
		t.Fatalf("claim of %d by another claimer: ok %v, err %v; want refused", port, ok, err)
	}
	if ok, err := second.claim(port + 1); !ok || err != nil {
		t.Fatalf("claim of the free port %d: ok %v, err %v", port+1, ok, err)
	}
}

func TestPortClaimWithoutLockDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c := newPortClaimer(filepath.Join(file, "ports"))
	ok, err := c.claim(20001)
	if !ok || err == nil || !strings.Contains(err.Error(), "port lock directory") {
		t.Fatalf("claim without a lock directory: ok %v, err %v; want claimed with an error naming the directory", ok, err)
	}
	if ok, _ := c.claim(20001); ok {
		t.Fatal("a port claimed within the process only was claimed twice")
	}
}

func TestFreePortsNeverRepeatAcrossCalls(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		for _, p := range FreePorts(t, 2) {
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
			if ok, _ := portClaims.claim(p); ok {
				t.Fatalf("port %d handed out but not claimed", p)
			}
		}
	}
}
