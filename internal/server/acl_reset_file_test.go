package server

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A FIFO as the ACL bootstrap reset file is refused naming it, instead of
// blocking the bootstrap call in its open; a missing file allows no reset.
func TestReadResetIndexRefusesAFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, ACLBootstrapResetFile)
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readResetIndex(fifo); err == nil || !strings.Contains(err.Error(), "ACL bootstrap reset file "+fifo+": not a regular file (a FIFO)") {
		t.Errorf("readResetIndex(FIFO) = %v", err)
	}
	if n, err := readResetIndex(filepath.Join(dir, "missing")); n != 0 || err != nil {
		t.Errorf("readResetIndex(missing) = %d, %v; want 0, nil", n, err)
	}
}
