package nodevolumes

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// testRecord returns a valid published record of volume v of workload w1.
func testRecord(t *testing.T, volume string) *record {
	t.Helper()
	u, err := normaliseUsage(&csisupdv1.VolumeUsage{})
	if err != nil {
		t.Fatal(err)
	}
	rt := roots{Host: "/mnt/csisupd"}
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	r := &record{Version: recordVersion, PluginID: "tp", VolumeID: volume, ExternalID: "ext-" + volume, WorkloadID: "w1",
		Usage: u, UsageKey: u.key(), Roots: rt, HostPath: rt.targetPath("w1", volume, u.key()),
		StagingPath: rt.stagingPath(volume, u.key()), State: StatePublished, CreatedAt: at, UpdatedAt: at}
	r.PluginPath, _ = rt.pluginPath(r.HostPath)
	r.PluginStagingPath, _ = rt.pluginPath(r.StagingPath)
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
	return r
}

// openTestStore opens the store of dir, failing the test on an error.
func openTestStore(t *testing.T, dir string) (*store, map[string]*record) {
	t.Helper()
	s, recs, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s, recs
}

// wantRecords fails unless got holds exactly want, by name and content.
func wantRecords(t *testing.T, got map[string]*record, want ...*record) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("records = %d, want %d", len(got), len(want))
	}
	for _, w := range want {
		g, ok := got[w.name()]
		if !ok {
			t.Errorf("record of volume %s missing", w.VolumeID)
			continue
		}
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		if !bytes.Equal(gb, wb) {
			t.Errorf("record of volume %s = %s, want %s", w.VolumeID, gb, wb)
		}
	}
}

// dirFiles returns the names of the files in dir.
func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestJournalWritesRemovesAndSyncs(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), RecordsDir)
	s, recs := openTestStore(t, dir)
	if len(recs) != 0 {
		t.Fatalf("records of a new directory = %v", recs)
	}
	a, b := testRecord(t, "v1"), testRecord(t, "v2")
	steps := []struct {
		name  string
		do    func() error
		syncs uint64
	}{
		{"write a", func() error { return s.write(a) }, 1},
		{"write b", func() error { return s.write(b) }, 1},
		{"change a", func() error { a.State = StateUnpublishing; return s.write(a) }, 1},
		{"remove b", func() error { return s.remove(b.name()) }, 1},
		{"remove b again", func() error { return s.remove(b.name()) }, 0},
	}
	for _, st := range steps {
		before := s.syncs.Load()
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := s.syncs.Load() - before; got != st.syncs {
			t.Errorf("%s: %d syncs, want %d", st.name, got, st.syncs)
		}
	}
	_, recs = openTestStore(t, dir)
	wantRecords(t, recs, a)
	if n, err := CountRecords(filepath.Dir(dir)); err != nil || n != 1 {
		t.Errorf("CountRecords = %d, %v; want 1", n, err)
	}
	for path, mode := range map[string]os.FileMode{dir: dirMode, filepath.Join(dir, journalName): fileMode} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s mode = %v, %v; want %v", path, fi.Mode(), err, mode)
		}
	}
}

// TestJournalClosed checks that a closed store takes no write and that
// what it synced before is read back.
func TestJournalClosed(t *testing.T) {
	dir := testutil.TempDir(t)
	s, _ := openTestStore(t, dir)
	r := testRecord(t, "v1")
	if err := s.write(r); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := s.write(testRecord(t, "v2")); !errors.Is(err, errStoreClosed) {
		t.Fatalf("write after close = %v, want %v", err, errStoreClosed)
	}
	if err := s.remove(r.name()); !errors.Is(err, errStoreClosed) {
		t.Fatalf("remove after close = %v, want %v", err, errStoreClosed)
	}
	_, recs := openTestStore(t, dir)
	wantRecords(t, recs, r)
}

func TestJournalTornTailIsDropped(t *testing.T) {
	line := func(t *testing.T, r *record) []byte {
		l, err := recordLine(r)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, tc := range []struct {
		name string
		tail func(t *testing.T) []byte
	}{
		{"half an entry", func(t *testing.T) []byte { l := line(t, testRecord(t, "v2")); return l[:len(l)/2] }},
		{"an entry without its newline", func(t *testing.T) []byte { l := line(t, testRecord(t, "v2")); return l[:len(l)-1] }},
		{"a bad checksum", func(t *testing.T) []byte { l := line(t, testRecord(t, "v2")); l[0] ^= 1; return l }},
		{"zeros", func(*testing.T) []byte { return make([]byte, 300) }},
		{"zeros and a newline", func(*testing.T) []byte { return append(make([]byte, 30), '\n') }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s, _ := openTestStore(t, dir)
			a := testRecord(t, "v1")
			if err := s.write(a); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, journalName)
			good, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, append(slices.Clone(good), tc.tail(t)...), fileMode); err != nil {
				t.Fatal(err)
			}
			s2, recs := openTestStore(t, dir)
			wantRecords(t, recs, a)
			if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, good) {
				t.Errorf("journal after open = %q, %v; want the torn entry truncated away (%q)", got, err, good)
			}
			// Appends after the cut are read back.
			b := testRecord(t, "v2")
			if err := s2.write(b); err != nil {
				t.Fatal(err)
			}
			_, recs = openTestStore(t, dir)
			wantRecords(t, recs, a, b)
		})
	}
}

func TestJournalCorruptionFailsOpen(t *testing.T) {
	a, b := testRecord(t, "v1"), testRecord(t, "v2")
	la, err := recordLine(a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := recordLine(b)
	if err != nil {
		t.Fatal(err)
	}
	checksum := func(payload string) []byte {
		return []byte(fmt.Sprintf("%08x %s\n", crcOf([]byte(payload)), payload))
	}
	bad := slices.Clone(la)
	bad[20] ^= 1
	invalid := *a
	invalid.ExternalID = ""
	li, _ := recordLine(&invalid)
	misnamed, _ := json.Marshal(a)
	for _, tc := range []struct {
		name    string
		journal [][]byte
		want    []string
	}{
		{"a bad entry followed by a good one", [][]byte{la, bad, lb}, []string{"line 2 (offset " + fmt.Sprint(len(la)) + ")", "checksum"}},
		{"a torn entry followed by a good one", [][]byte{la[:10], []byte("\n"), lb}, []string{"line 1 (offset 0)"}},
		{"an invalid record", [][]byte{la, li}, []string{"line 2", "external_id"}},
		{"a record under another name", [][]byte{checksum(fmt.Sprintf(`{"name":%q,"record":%s}`, b.name(), misnamed))}, []string{"line 1", "belongs in"}},
		{"an entry of unknown fields", [][]byte{checksum(`{"name":"x","what":1}`)}, []string{"line 1", "unknown field"}},
		{"an entry neither record nor removal", [][]byte{checksum(`{"name":"x"}`)}, []string{"line 1", "exactly one"}},
		{"no JSON", [][]byte{checksum(`hello`)}, []string{"line 1", "invalid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, journalName)
			content := bytes.Join(tc.journal, nil)
			if err := os.WriteFile(file, content, fileMode); err != nil {
				t.Fatal(err)
			}
			stale := filepath.Join(dir, journalTemp)
			if err := os.WriteFile(stale, []byte("half"), fileMode); err != nil {
				t.Fatal(err)
			}
			_, _, err := openStore(dir)
			if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("open: %v, want the journal %s corrupt", err, file)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("open: %v, want it to name %q", err, w)
				}
			}
			if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, content) {
				t.Errorf("journal after a failed open = %q, %v; want it unchanged", got, err)
			}
			if !exists(stale) {
				t.Error("an unfinished write was removed while the journal is corrupt")
			}
		})
	}
}

func TestJournalGroupCommit(t *testing.T) {
	s, _ := openTestStore(t, t.TempDir())
	const writers = 16
	recs := make([]*record, writers)
	for i := range recs {
		recs[i] = testRecord(t, fmt.Sprintf("v%d", i))
	}
	before := s.syncs.Load()
	// While a sync holds syncMu, every writer appends and waits: the
	// next sync covers all of them.
	s.syncMu.Lock()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for _, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.write(r)
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "every writer appended", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.seq == writers
	})
	s.syncMu.Unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := s.syncs.Load() - before; got != 1 {
		t.Errorf("%d concurrent writes made %d syncs, want 1", writers, got)
	}
	_, got := openTestStore(t, s.dir)
	wantRecords(t, got, recs...)
}

func TestJournalCompaction(t *testing.T) {
	dir := t.TempDir()
	s, _ := openTestStore(t, dir)
	a, b := testRecord(t, "v1"), testRecord(t, "v2")
	if err := s.write(b); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, journalName)
	compacted := false
	for i := 0; i < 1000 && !compacted; i++ {
		a.Error = fmt.Sprintf("attempt %d", i)
		if err := s.write(a); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > compactMin+4096 {
			t.Fatalf("journal of %d bytes, beyond the bound of %d", fi.Size(), compactMin)
		}
		compacted = i > 0 && fi.Size() < 4096
	}
	if !compacted {
		t.Fatal("the journal was never compacted")
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != fileMode {
		t.Errorf("compacted journal mode = %v, %v; want %v", fi.Mode(), err, fileMode)
	}
	if files := dirFiles(t, dir); !slices.Equal(files, []string{journalName}) {
		t.Errorf("files after compaction = %v, want the journal only", files)
	}
	// Writes after the compaction go to the new journal.
	if err := s.remove(b.name()); err != nil {
		t.Fatal(err)
	}
	_, recs := openTestStore(t, dir)
	wantRecords(t, recs, a)
}

func TestJournalRewritesAfterAFailure(t *testing.T) {
	dir := t.TempDir()
	s, _ := openTestStore(t, dir)
	a, b := testRecord(t, "v1"), testRecord(t, "v2")
	if err := s.write(a); err != nil {
		t.Fatal(err)
	}
	// A failed write or sync leaves the journal's content unknown: the
	// next write rewrites it from the live records.
	s.mu.Lock()
	s.broken = errors.New("injected")
	s.mu.Unlock()
	if _, err := s.f.Write([]byte("garbage that a failed write left\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.write(b); err != nil {
		t.Fatal(err)
	}
	if s.broken != nil {
		t.Errorf("the journal is still broken after its rewrite: %v", s.broken)
	}
	_, recs := openTestStore(t, dir)
	wantRecords(t, recs, a, b)
}

// legacyFile writes r as a record file of the per-file format.
func legacyFile(t *testing.T, dir string, r *record) {
	t.Helper()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, r.name()), append(b, '\n'), fileMode); err != nil {
		t.Fatal(err)
	}
}

// TestJournalMigration cuts the migration of per-file records into the
// journal at each of its steps: the records are appended to the journal
// (a cut may tear any of them), the journal synced, each file removed,
// the directory synced. Opening the directory then loses and doubles
// nothing, and leaves the journal only.
func TestJournalMigration(t *testing.T) {
	recs := []*record{testRecord(t, "v1"), testRecord(t, "v2"), testRecord(t, "v3")}
	slices.SortFunc(recs, func(a, b *record) int { return strings.Compare(a.name(), b.name()) })
	// The journal a finished migration leaves.
	done := t.TempDir()
	for _, r := range recs {
		legacyFile(t, done, r)
	}
	s, _ := openTestStore(t, done)
	if files := dirFiles(t, done); !slices.Equal(files, []string{journalName}) {
		t.Fatalf("files after the migration = %v, want the journal only", files)
	}
	if s.syncs.Load() != 3 {
		t.Errorf("the migration made %d syncs, want 3 (the new journal's directory entry, the journal, the directory)", s.syncs.Load())
	}
	full, err := os.ReadFile(filepath.Join(done, journalName))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(full, []byte("\n"))
	lines = lines[:len(lines)-1]
	if len(lines) != len(recs) {
		t.Fatalf("the migrated journal has %d entries, want %d", len(lines), len(recs))
	}

	type cut struct {
		name    string
		journal []byte // nil: no journal
		files   []*record
	}
	cuts := []cut{{"before the journal exists", nil, recs}, {"with the journal empty", []byte{}, recs}}
	for i := range lines {
		prefix := bytes.Join(lines[:i], nil)
		cuts = append(cuts,
			cut{fmt.Sprintf("appending entry %d, torn", i+1), append(slices.Clone(prefix), lines[i][:len(lines[i])/2]...), recs},
			cut{fmt.Sprintf("after appending entry %d", i+1), bytes.Join(lines[:i+1], nil), recs})
	}
	for i := range recs {
		cuts = append(cuts, cut{fmt.Sprintf("after removing %d files", i), full, recs[i:]})
	}
	cuts = append(cuts, cut{"before syncing the directory", full, nil})
	for _, c := range cuts {
		t.Run(c.name, func(t *testing.T) {
			dataDir := t.TempDir()
			dir := filepath.Join(dataDir, RecordsDir)
			if err := os.Mkdir(dir, dirMode); err != nil {
				t.Fatal(err)
			}
			for _, r := range c.files {
				legacyFile(t, dir, r)
			}
			if c.journal != nil {
				if err := os.WriteFile(filepath.Join(dir, journalName), c.journal, fileMode); err != nil {
					t.Fatal(err)
				}
			}
			if n, err := CountRecords(dataDir); err != nil || n != len(recs) {
				t.Errorf("CountRecords before opening = %d, %v; want %d", n, err, len(recs))
			}
			_, got := openTestStore(t, dir)
			wantRecords(t, got, recs...)
			if files := dirFiles(t, dir); !slices.Equal(files, []string{journalName}) {
				t.Errorf("files after the migration = %v, want the journal only", files)
			}
			j, err := os.ReadFile(filepath.Join(dir, journalName))
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(j, []byte("\n")); n != len(recs) {
				t.Errorf("the journal holds %d entries, want one per record (%d)", n, len(recs))
			}
			_, again := openTestStore(t, dir)
			wantRecords(t, again, recs...)
		})
	}
}
