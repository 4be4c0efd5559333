package nodevolumes

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// journalName is the file of the records' journal in the records
// directory, and journalTemp the file a compaction writes before renaming
// it over the journal.
const (
	journalName = "journal"
	journalTemp = ".journal.tmp"
)

// A journal larger than compactMin bytes and compactRatio times its live
// records is rewritten with the live records only.
const (
	compactMin   = 64 << 10
	compactRatio = 4
)

// entry is one change of the journal: a record's new content, or its
// removal. On disk each entry is one line: the crc32c (Castagnoli) of its
// JSON in 8 hex digits, a space, the JSON and a newline.
type entry struct {
	Name    string          `json:"name"`
	Record  json.RawMessage `json:"record,omitempty"`
	Removed bool            `json:"removed,omitempty"`
}

// encodeLine returns e as a journal line.
func encodeLine(e entry) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	line := make([]byte, 0, 10+len(b))
	line = fmt.Appendf(line, "%08x ", crcOf(b))
	line = append(line, b...)
	return append(line, '\n'), nil
}

// crcOf returns the crc32c of b.
func crcOf(b []byte) uint32 { return crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)) }

// checksummed returns the JSON of a journal line (without its newline),
// and whether its checksum matches.
func checksummed(line []byte) ([]byte, bool) {
	if len(line) < 10 || line[8] != ' ' {
		return nil, false
	}
	var sum [4]byte
	if _, err := hex.Decode(sum[:], line[:8]); err != nil {
		return nil, false
	}
	payload := line[9:]
	return payload, crcOf(payload) == uint32(sum[0])<<24|uint32(sum[1])<<16|uint32(sum[2])<<8|uint32(sum[3])
}

// decodeRecord decodes a record read from disk and checks it: its fields,
// and that name is the one its identity gives.
func decodeRecord(b []byte, name string) (*record, error) {
	r := new(record)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		return nil, err
	}
	if err := r.check(); err != nil {
		return nil, err
	}
	if r.name() != name {
		return nil, fmt.Errorf("its mount (plugin %q, volume %q, workload %q, usage %q) belongs in %q",
			r.PluginID, r.VolumeID, r.WorkloadID, r.UsageKey, r.name())
	}
	return r, nil
}

// store keeps the records of one directory in an append-only journal.
// Each change is one appended entry made durable by one sync of the
// journal; writers whose entries a sync of another writer covered do not
// sync again (group commit). The Manager holds the records in memory and
// writes each change through.
//
// Records of the earlier format, one file per record, are taken into the
// journal when the store opens.
type store struct {
	dir   string
	syncs atomic.Uint64 // syncs of the journal and of the directory

	// syncMu is held across each sync and rewrite of the journal. synced
	// is the count of entries the latest sync covers.
	syncMu sync.Mutex
	synced uint64

	mu   sync.Mutex
	f    *os.File // the journal, opened to append
	size int64    // bytes written to the journal
	seq  uint64   // entries appended
	// live holds the line of each live record by name, and liveSize their
	// total length: what a rewrite writes.
	live     map[string][]byte
	liveSize int64
	// broken is set when a write or sync of the journal failed: what it
	// holds is unknown, so the next sync rewrites it instead.
	broken error
	// closed is set by close: the journal takes no more writes.
	closed bool
}

// errStoreClosed is the error of a write to a closed store.
var errStoreClosed = errors.New("volumes: the mount records' journal is closed")

// journalState is what a journal holds, as read from disk.
type journalState struct {
	records map[string]*record
	lines   map[string][]byte
	// good is the length of the journal up to its last whole entry, and
	// torn tells that a torn last entry follows it.
	good   int64
	torn   bool
	exists bool
}

// readJournal replays the journal file. A torn or unchecksummed last
// entry is a write that was never acknowledged: it is reported (torn) and
// left out. A bad entry followed by others is corruption, as is an entry
// whose record is not valid: an error naming the file, the line and its
// offset.
func readJournal(file string) (journalState, error) {
	st := journalState{records: make(map[string]*record), lines: make(map[string][]byte)}
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("volumes: read records journal %q: %w", file, err)
	}
	st.exists = true
	var errs []error
	for off, n := 0, 1; off < len(b); n++ {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			st.torn = true
			break
		}
		next := off + i + 1
		payload, ok := checksummed(b[off : off+i])
		if !ok {
			if next == len(b) {
				st.torn = true
				break
			}
			return st, fmt.Errorf("volumes: records journal %q is corrupt: line %d (offset %d) does not match its checksum and entries follow it", file, n, off)
		}
		if err := st.apply(payload, b[off:next]); err != nil {
			errs = append(errs, fmt.Errorf("volumes: records journal %q is corrupt: line %d (offset %d): %w", file, n, off, err))
		}
		off = next
		st.good = int64(off)
	}
	return st, errors.Join(errs...)
}

// apply replays one entry: its JSON and its whole line.
func (st *journalState) apply(payload, line []byte) error {
	var e entry
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return err
	}
	switch {
	case e.Name == "" || e.Removed == (len(e.Record) > 0):
		return errors.New("the entry names no record, or is not exactly one of a record and a removal")
	case e.Removed:
		delete(st.records, e.Name)
		delete(st.lines, e.Name)
		return nil
	}
	r, err := decodeRecord(e.Record, e.Name)
	if err != nil {
		return fmt.Errorf("record %q: %w", e.Name, err)
	}
	st.records[e.Name], st.lines[e.Name] = r, bytes.Clone(line)
	return nil
}

// readDir reads the journal and the per-file records of dir, changing
// nothing. It returns the names of the per-file records and of the
// temporary files of unfinished writes.
func readDir(dir string) (st journalState, files map[string]*record, temps []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return st, nil, nil, fmt.Errorf("volumes: read records directory %q: %w", dir, err)
	}
	st, jerr := readJournal(filepath.Join(dir, journalName))
	errs := []error{jerr}
	files = make(map[string]*record)
	for _, e := range entries {
		name := e.Name()
		file := filepath.Join(dir, name)
		switch {
		case isTemp(name):
			temps = append(temps, file)
			continue
		case e.IsDir() || !strings.HasSuffix(name, ".json"):
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("volumes: read record %q: %w", file, err))
			continue
		}
		r, err := decodeRecord(b, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("volumes: record %q is corrupt: %w", file, err))
			continue
		}
		files[name] = r
	}
	return st, files, temps, errors.Join(errs...)
}

// CountRecords returns the number of mount records in the records
// directory of dataDir, reading it without changing anything: the
// journal's live records and the per-file records not yet taken into it.
// A missing directory holds none.
func CountRecords(dataDir string) (int, error) {
	st, files, _, err := readDir(filepath.Join(dataDir, RecordsDir))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := len(st.records)
	for name := range files {
		if st.records[name] == nil {
			n++
		}
	}
	return n, nil
}

// isTemp reports whether a file name is one of the temporary files of the
// store's writes.
func isTemp(name string) bool { return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp") }

// openStore creates the records directory when missing, reads every
// record in it and opens its journal. A torn last entry of the journal is
// truncated away. Per-file records are appended to the journal, which is
// synced, and only then removed, and the directory synced: a migration cut
// at any point loses and doubles nothing, since a record in the journal
// takes precedence over its file. Temporary files of writes that never
// finished are removed. A record that cannot be read or decoded, or whose
// content does not match its name, is an error naming its file (and line);
// nothing is removed then.
func openStore(dir string) (*store, map[string]*record, error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, nil, fmt.Errorf("volumes: create records directory %q: %w", dir, err)
	}
	st, files, temps, err := readDir(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &store{dir: dir, live: st.lines, size: st.good}
	for _, l := range s.live {
		s.liveSize += int64(len(l))
	}
	file := filepath.Join(dir, journalName)
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, fileMode)
	if err != nil {
		return nil, nil, fmt.Errorf("volumes: open records journal %q: %w", file, err)
	}
	s.f = f
	if err := s.prepare(st, files); err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	for _, t := range temps {
		// A temporary file never renamed holds nothing that the journal
		// or the record it was to replace does not hold.
		if err := os.Remove(t); err != nil && !errors.Is(err, os.ErrNotExist) {
			_ = f.Close()
			return nil, nil, fmt.Errorf("volumes: remove unfinished record write %q: %w", t, err)
		}
	}
	if defectForgetRecord {
		return s, map[string]*record{}, nil
	}
	return s, st.records, nil
}

// prepare makes the journal s.f opened durable, cuts its torn tail and
// takes the per-file records into it. The records of st gain the files'.
func (s *store) prepare(st journalState, files map[string]*record) error {
	file := s.f.Name()
	if err := s.f.Chmod(fileMode); err != nil {
		return fmt.Errorf("volumes: open records journal %q: %w", file, err)
	}
	if !st.exists {
		if err := s.syncDir(); err != nil {
			return err
		}
	}
	if st.torn {
		if err := s.f.Truncate(st.good); err != nil {
			return fmt.Errorf("volumes: truncate the torn end of records journal %q: %w", file, err)
		}
		if err := s.sync(); err != nil {
			return err
		}
	}
	if len(files) == 0 {
		return nil
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	var buf []byte
	for _, name := range names {
		if st.records[name] != nil {
			continue // taken in before a cut migration: the journal's is as new
		}
		line, err := recordLine(files[name])
		if err != nil {
			return err
		}
		st.records[name], s.live[name] = files[name], line
		s.liveSize += int64(len(line))
		buf = append(buf, line...)
	}
	if len(buf) > 0 {
		n, err := s.f.Write(buf)
		s.size += int64(n)
		if err != nil {
			return fmt.Errorf("volumes: write records journal %q: %w", file, err)
		}
		if err := s.sync(); err != nil {
			return err
		}
	}
	for _, name := range names {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("volumes: remove record %q taken into the journal: %w", filepath.Join(s.dir, name), err)
		}
	}
	return s.syncDir()
}

// recordLine returns the journal line of r's content.
func recordLine(r *record) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("volumes: encode record of volume %q: %w", r.VolumeID, err)
	}
	line, err := encodeLine(entry{Name: r.name(), Record: b})
	if err != nil {
		return nil, fmt.Errorf("volumes: encode record of volume %q: %w", r.VolumeID, err)
	}
	return line, nil
}

// write stores r durably: its entry is appended to the journal, which is
// synced unless another writer's sync covered it.
func (s *store) write(r *record) error {
	line, err := recordLine(r)
	if err != nil {
		return err
	}
	return s.append(r.name(), line, line)
}

// remove deletes the record named name durably. A missing record is not
// an error, and writes nothing.
func (s *store) remove(name string) error {
	s.mu.Lock()
	_, ok := s.live[name]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	line, err := encodeLine(entry{Name: name, Removed: true})
	if err != nil {
		return fmt.Errorf("volumes: encode removal of record %q: %w", name, err)
	}
	return s.append(name, nil, line)
}

// append appends line, the change of the record named name to the
// journal line content (nil for a removal), and returns once it is
// durable.
func (s *store) append(name string, content, line []byte) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errStoreClosed
	}
	s.liveSize -= int64(len(s.live[name]))
	if content == nil {
		delete(s.live, name)
	} else {
		s.live[name] = content
		s.liveSize += int64(len(content))
	}
	if s.broken == nil {
		n, err := s.f.Write(line)
		s.size += int64(n)
		if err != nil {
			s.broken = err
		}
	}
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	return s.syncTo(seq)
}

// syncTo returns once the entries up to seq are durable: covered by a
// sync of another writer, or by one it makes, which covers every entry
// appended by then. After a failed write or sync the journal is rewritten
// from the live records instead.
func (s *store) syncTo(seq uint64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced >= seq {
		return nil
	}
	s.mu.Lock()
	broken, target, closed := s.broken, s.seq, s.closed
	s.mu.Unlock()
	if closed {
		return errStoreClosed
	}
	if broken != nil {
		if err := s.rewrite(); err != nil {
			return fmt.Errorf("%w (after %w)", err, broken)
		}
		return nil
	}
	if err := s.sync(); err != nil {
		s.mu.Lock()
		s.broken = err
		s.mu.Unlock()
		return err
	}
	s.synced = target
	s.mu.Lock()
	compact := s.size > max(compactRatio*s.liveSize, compactMin)
	s.mu.Unlock()
	if compact {
		// The entries are durable already; a failed compaction is
		// tried again after a later write.
		_ = s.rewrite()
	}
	return nil
}

// rewrite replaces the journal with one of the live records: a temporary
// file is written and synced, renamed over the journal, and the directory
// synced. s.syncMu is held.
func (s *store) rewrite() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.live))
	for name := range s.live {
		names = append(names, name)
	}
	slices.Sort(names)
	buf := make([]byte, 0, s.liveSize)
	for _, name := range names {
		buf = append(buf, s.live[name]...)
	}
	tmp := filepath.Join(s.dir, journalTemp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, fileMode)
	if err != nil {
		return fmt.Errorf("volumes: rewrite records journal %q: %w", tmp, err)
	}
	err = f.Chmod(fileMode)
	if err == nil {
		_, err = f.Write(buf)
	}
	if err == nil {
		err = f.Sync()
		s.syncs.Add(1)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, journalName))
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("volumes: rewrite records journal %q: %w", filepath.Join(s.dir, journalName), err)
	}
	// The new journal is in place, and appends go to it. Until the
	// directory is synced its name may not be durable, so the journal
	// stays broken (rewritten again) when that fails.
	_ = s.f.Close()
	s.f, s.size = f, int64(len(buf))
	if err := s.syncDir(); err != nil {
		s.broken = err
		return err
	}
	s.broken, s.synced = nil, s.seq
	return nil
}

// close closes the journal; later writes fail with errStoreClosed. A
// write that a sync had not covered yet is not durable.
func (s *store) close() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("volumes: close records journal %q: %w", s.f.Name(), err)
	}
	return nil
}

// sync syncs the journal.
func (s *store) sync() error {
	s.syncs.Add(1)
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("volumes: sync records journal %q: %w", s.f.Name(), err)
	}
	return nil
}

func (s *store) syncDir() error {
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("volumes: sync records directory %q: %w", s.dir, err)
	}
	defer d.Close()
	s.syncs.Add(1)
	if err := d.Sync(); err != nil {
		return fmt.Errorf("volumes: sync records directory %q: %w", s.dir, err)
	}
	return nil
}
