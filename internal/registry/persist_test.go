package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestPersistRoundTrip(t *testing.T) {
	dir := testutil.TempDir(t)
	reg := New(Config{})
	fp := fingerprint.Fingerprint{
		VendorName: "csi.example.com", VendorVersion: "1.2.3", Type: plugin.TypeMonolith,
		NodeID: "node-1", MaxVolumes: 7, AccessibleTopology: map[string]string{"zone": "a"},
		ControllerCapabilities: []string{"CREATE_DELETE_VOLUME"},
	}
	reg.Register("a", inst(1), &fp)
	reg.SetHealth("a", inst(1), healthy("healthy"))
	reg.Register("b", plugin.Instance{Path: "/plugins/b.sock", Inode: 2}, nil)

	p := newPersister(dir, reg, testLogger(t))
	if err := p.save(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != StateFileName {
		t.Errorf("data directory holds %v, want only %s (no temporary files)", entries, StateFileName)
	}

	restored := New(Config{})
	if err := newPersister(dir, restored, testLogger(t)).load(); err != nil {
		t.Fatal(err)
	}
	got := restored.List()
	if len(got) != 2 {
		t.Fatalf("restored %d plugins, want 2", len(got))
	}
	a := got[0]
	if a.ID != "a" || a.Instance != inst(1) || !a.Fingerprint.Equal(fp) || !a.Fingerprinted {
		t.Errorf("restored a = %+v", a)
	}
	if a.Health.State != heartbeat.Unknown {
		t.Errorf("restored health = %s, want unknown until probed", a.Health.State)
	}
	if evs, _ := restored.Events(0); len(evs) != 0 {
		t.Errorf("restore emitted events: %+v", evs)
	}
}

func TestPersistLoadWithoutFile(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "data") // created by load
	reg := New(Config{})
	if err := newPersister(dir, reg, testLogger(t)).load(); err != nil {
		t.Fatal(err)
	}
	if len(reg.List()) != 0 {
		t.Error("plugins restored from no file")
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("data directory not created: %v", err)
	}
}

func TestPersistSetsUnreadableFilesAside(t *testing.T) {
	tests := []struct {
		name    string
		content string
	}{
		{"not json", "{not json"},
		{"truncated", `{"version": 1, "plugins": [{"id": "a"`},
		{"other version", `{"version": 99, "plugins": []}`},
		{"no version", `{"plugins": []}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			path := filepath.Join(dir, StateFileName)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			reg := New(Config{})
			if err := newPersister(dir, reg, testLogger(t)).load(); err != nil {
				t.Fatalf("load of an unreadable file failed: %v", err)
			}
			if len(reg.List()) != 0 {
				t.Error("plugins restored from an unreadable file")
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("unreadable file still in place: %v", err)
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Fatalf("set-aside files = %v, want one", aside)
			}
			if b, _ := os.ReadFile(aside[0]); string(b) != tt.content {
				t.Errorf("set-aside content = %q, want the original", b)
			}
		})
	}
}

func TestPersistSkipsInvalidRecords(t *testing.T) {
	dir := testutil.TempDir(t)
	f := stateFile{Version: stateFormatVersion, Plugins: []Plugin{
		{ID: "ok", Instance: plugin.Instance{Path: "/p/ok.sock"}},
		{ID: "bad id", Instance: plugin.Instance{Path: "/p/x.sock"}},
		{ID: "nosocket"},
	}}
	data, _ := json.Marshal(f)
	if err := os.WriteFile(filepath.Join(dir, StateFileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	reg := New(Config{})
	if err := newPersister(dir, reg, testLogger(t)).load(); err != nil {
		t.Fatal(err)
	}
	if got := reg.List(); len(got) != 1 || got[0].ID != "ok" {
		t.Errorf("restored %+v, want only ok", got)
	}
}

func TestPersistSavesOnlyChanges(t *testing.T) {
	dir := testutil.TempDir(t)
	path := filepath.Join(dir, StateFileName)
	reg := New(Config{})
	reg.Register("a", inst(1), nil)
	p := newPersister(dir, reg, testLogger(t))
	if err := p.save(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := p.save(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an unchanged registry was written again (stat: %v)", err)
	}
	reg.SetHealth("a", inst(1), healthy("healthy"))
	if err := p.save(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("a changed registry was not written: %v", err)
	}
}

func TestPersisterWritesAfterChanges(t *testing.T) {
	dir := testutil.TempDir(t)
	reg := New(Config{})
	p := newPersister(dir, reg, testLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx, nil) })
	defer func() {
		cancel()
		wg.Wait()
	}()

	for i := range 50 {
		reg.Register(fmt.Sprintf("p%02d", i), inst(uint64(i)), nil)
	}
	testutil.WaitFor(t, 10*time.Second, "all 50 plugins on disk", func() bool {
		plugins, err := readStateFile(filepath.Join(dir, StateFileName))
		return err == nil && len(plugins) == 50
	})
}
