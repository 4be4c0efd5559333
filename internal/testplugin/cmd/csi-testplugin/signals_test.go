package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testplugin/journal"
)

func TestRunTimeFaultFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string // "" parses
	}{
		{[]string{"--socket", "/s", "--foreign-volumes"}, ""},
		{[]string{"--socket", "/s", "--foreign-volumes", "--node-local"}, "--foreign-volumes and --node-local"},
		{[]string{"--socket", "/s", "--slow-delay", "0s"}, "--slow-delay must be positive"},
		{[]string{"--socket", "/s", "--slow-delay", "500ms"}, ""},
	}
	for _, tt := range tests {
		o, err := parse(tt.args, io.Discard)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.want != "" && (err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want a usage error with %q", tt.args, err, tt.want)
		case tt.want == "" && slices.Contains(tt.args, "--foreign-volumes") && !o.foreignVolumes:
			t.Errorf("%q: foreign volumes not set", tt.args)
		}
	}
}

// TestSignals checks the run-time faults of a plugin process: SIGUSR1
// slows a call past its caller's deadline and SIGUSR2 ends that, SIGHUP
// makes the next mutating call exit with status 3 after its work, with
// the journal's begin record and no end record.
func TestSignals(t *testing.T) {
	dir := shortDir(t)
	sock, path := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "calls.jsonl")
	cmd := start(t, "--socket", sock, "--node-id", "n1", "--state-dir", filepath.Join(dir, "state"),
		"--journal", path, "--slow-delay", "3s")
	ctrl, _ := csiClient(t, sock)
	within := func(d time.Duration, name string) error {
		cctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		_, err := ctrl.CreateVolume(cctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{snwCap}})
		return err
	}
	// The signal is handled asynchronously: slow until a call misses a
	// 1s deadline, each try a fresh volume.
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	slowed := false
	for i := range 10 {
		if err := within(time.Second, fmt.Sprintf("slow-%d", i)); err != nil {
			slowed = true
			break
		}
	}
	if !slowed {
		t.Fatal("calls kept answering within 1s after SIGUSR1 with --slow-delay 3s")
	}
	if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	fast := false
	for i := range 10 {
		if err := within(10*time.Second, fmt.Sprintf("fast-%d", i)); err == nil {
			if err := within(2*time.Second, fmt.Sprintf("fast2-%d", i)); err == nil {
				fast = true
				break
			}
		}
	}
	if !fast {
		t.Fatal("calls still slow after SIGUSR2")
	}

	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// SIGHUP is handled asynchronously too: mutating calls until one
	// crashes the process.
	crashed := false
	for i := range 20 {
		if err := within(5*time.Second, fmt.Sprintf("crash-%d", i)); err != nil {
			crashed = true
			break
		}
	}
	if !crashed {
		t.Fatal("no call crashed after SIGHUP")
	}
	if code := exitCode(t, cmd); code != testplugin.ExitCrash {
		t.Fatalf("exit status %d, want %d", code, testplugin.ExitCrash)
	}
	recs, err := journal.Read(path)
	if err != nil && !errors.Is(err, journal.ErrTornLine) {
		t.Fatal(err)
	}
	last := recs[len(recs)-1]
	if last.Method != "CreateVolume" || last.Phase != "begin" {
		t.Fatalf("last journal record %+v, want the begin of the crashed CreateVolume", last)
	}
}
