package testutil

import (
	"fmt"
	"os"
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
