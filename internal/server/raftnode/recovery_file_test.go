package raftnode

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A peers.json that is a FIFO, or too large, is refused naming the file;
// the FIFO is never opened (an open would block the server's start).
func TestReadPeersFileRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, []byte(strings.Repeat(" ", maxPeersFileSize+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo: "server: peers file " + fifo + ": not a regular file (a FIFO)",
		big:  "server: peers file " + big + ": larger than",
	} {
		if _, err := readPeersFile(path, "s1", "127.0.0.1:4781"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("readPeersFile(%s) = %v, want %q", path, err, want)
		}
	}
}
