package statepb_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// fixture is the upgrade fixture of test/upgrade: data_dirs and a snapshot
// file written by the release that stored the public messages.
const fixture = "../../../test/upgrade/testdata"

// TestFixtureDecodes decodes what the release before this package wrote,
// the upgrade fixture's raft log entries, raft snapshots and snapshot
// file, as storage messages, as the servers read them: none may keep an
// unknown field, and each, encoded again, must decode as the message that
// release stored (oldStored) to what the fixture's bytes do. The upgrade
// tests prove the same through the API; this names the field that does not
// decode.
func TestFixtureDecodes(t *testing.T) {
	oldSnapshot := oldStoredType(t, "StateSnapshot")
	oldEntry := oldStoredType(t, "LogEntry")
	snapshotType := (&statepb.StateSnapshot{}).ProtoReflect().Type()
	entryType := (&statepb.LogEntry{}).ProtoReflect().Type()

	snapshots, err := filepath.Glob(filepath.Join(fixture, "data", "*", "server", "raft", "snapshots", "*", "state.bin"))
	if err != nil {
		t.Fatal(err)
	}
	snapshots = append(snapshots, filepath.Join(fixture, "snapshot.bin"))
	if len(snapshots) < 4 {
		t.Fatalf("the fixture has %d snapshots, want one per server and the snapshot file", len(snapshots))
	}
	for _, path := range snapshots {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		decodesLosslessly(t, path, b, oldSnapshot, snapshotType)
	}

	dbs, err := filepath.Glob(filepath.Join(fixture, "data", "*", "server", "raft", "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	if len(dbs) != 3 {
		t.Fatalf("the fixture has %d raft logs, want 3", len(dbs))
	}
	for _, db := range dbs {
		entries := 0
		for idx, data := range commands(t, db) {
			entries++
			decodesLosslessly(t, fmt.Sprintf("%s entry %d", db, idx), data, oldEntry, entryType)
		}
		if entries == 0 {
			t.Errorf("%s holds no command", db)
		}
	}
}

// commands returns the data of every command entry of a raft log store,
// by index, read from a copy of it.
func commands(t *testing.T, db string) map[uint64][]byte {
	t.Helper()
	b, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	copied := filepath.Join(t.TempDir(), "raft.db")
	if err := os.WriteFile(copied, b, 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{Path: copied})
	if err != nil {
		t.Fatalf("open %s: %v", db, err)
	}
	defer store.Close()
	first, err := store.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, err := store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint64][]byte{}
	for i := first; i <= last && i > 0; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				continue // the gap a restore leaves
			}
			t.Fatalf("%s: entry %d: %v", db, i, err)
		}
		if l.Type == raft.LogCommand {
			out[i] = l.Data
		}
	}
	return out
}
