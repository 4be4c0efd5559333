package journal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/csisupd/csisupd/internal/testplugin"
)

// Record is one record of a journal, with File and Line set by Read.
type Record = testplugin.JournalRecord

// ErrTornLine matches the errors reporting a torn record: a record whose
// write a crash cut short. Read and Merge return their records together
// with such errors only.
var ErrTornLine = errors.New("torn journal record")

// TornLineError reports one torn record that Read skipped.
type TornLineError struct {
	File string
	Line int
	// Text is the start of the torn line, for the report.
	Text string
}

// Error names the file and line.
func (e *TornLineError) Error() string {
	return fmt.Sprintf("%s:%d: torn journal record skipped (a write cut short by a crash): %q", e.File, e.Line, e.Text)
}

// Is makes errors.Is(err, ErrTornLine) true.
func (e *TornLineError) Is(target error) bool { return target == ErrTornLine }

// maxTornText bounds TornLineError.Text.
const maxTornText = 80

// Read reads the journal file at path. A torn record is skipped: a line
// that is not even valid JSON and is the last one, or is followed by the first
// record of a plugin instance (Seq 1), which is how a restarted plugin
// leaves the torn tail of the one before (it ends it with a newline before
// appending). Then Read returns every other record together with
// an error matching ErrTornLine; callers that expect crashes accept it.
// Any other problem returns no records and an error naming the file and
// line: a line that is not a JSON record, a record missing a field or
// with an unknown one, a sequence number not above the instance's
// previous one, an end record without its begin record.
func Read(path string) ([]Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	lines := bytes.Split(data, []byte{'\n'})
	// Split leaves an empty last element after a final newline, and the
	// unterminated tail otherwise.
	tail := lines[len(lines)-1]
	lines = lines[:len(lines)-1]
	var (
		recs  []Record
		torn  []error
		state = make(map[string]*instanceState)
	)
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue // holds nothing; left by two plugins terminating one torn tail
		}
		r, err := parse(line)
		if err != nil {
			if !json.Valid(line) && restartFollows(lines[i+1:], tail) {
				torn = append(torn, tornError(path, i+1, line))
				continue
			}
			return nil, fmt.Errorf("journal: %s:%d: bad record: %w", path, i+1, err)
		}
		r.File, r.Line = path, i+1
		if err := check(r, state); err != nil {
			return nil, fmt.Errorf("journal: %s:%d: bad record: %w", path, i+1, err)
		}
		recs = append(recs, r)
	}
	if len(bytes.TrimSpace(tail)) > 0 {
		n := len(lines) + 1
		r, err := parse(tail)
		switch {
		case err != nil && json.Valid(tail):
			return nil, fmt.Errorf("journal: %s:%d: bad record: %w", path, n, err)
		case err != nil:
			torn = append(torn, tornError(path, n, tail))
		default:
			// Whole but for its newline: a record all the same.
			r.File, r.Line = path, n
			if err := check(r, state); err != nil {
				return nil, fmt.Errorf("journal: %s:%d: bad record: %w", path, n, err)
			}
			recs = append(recs, r)
		}
	}
	return recs, errors.Join(torn...)
}

func tornError(path string, line int, text []byte) error {
	if len(text) > maxTornText {
		text = text[:maxTornText]
	}
	return &TornLineError{File: path, Line: line, Text: string(text)}
}

// restartFollows reports whether the first record after a bad line starts
// a plugin instance: the bad line is then the torn tail of a killed one.
// A bad line in between is skipped when it is torn itself: a plugin
// killed again while writing its first record.
func restartFollows(rest [][]byte, tail []byte) bool {
	for i, l := range rest {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		r, err := parse(l)
		if err != nil {
			return !json.Valid(l) && restartFollows(rest[i+1:], tail)
		}
		return r.Seq == 1
	}
	// Nothing follows: the line is the journal's torn end, which a
	// restarted plugin terminated before it was killed in turn.
	if len(bytes.TrimSpace(tail)) == 0 {
		return true
	}
	r, err := parse(tail)
	return err != nil || r.Seq == 1
}

// parse decodes one line strictly: unknown fields are errors, so a
// journal of another format is not half read.
func parse(line []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, fmt.Errorf("not a JSON record: %w", err)
	}
	if dec.More() {
		return Record{}, errors.New("more than one JSON value on the line")
	}
	return r, nil
}

// instanceState is what Read remembers of one plugin instance to check
// the next record.
type instanceState struct {
	seq    uint64
	begins map[uint64]bool // calls whose begin was read
}

// check validates r against the records before it in the same file.
func check(r Record, state map[string]*instanceState) error {
	switch {
	case r.Instance == "":
		return errors.New("no instance")
	case r.Seq == 0:
		return errors.New("no seq")
	case r.Method == "":
		return errors.New("no method")
	case r.Time.IsZero():
		return errors.New("no time")
	}
	st := state[r.Instance]
	if st == nil {
		st = &instanceState{begins: make(map[uint64]bool)}
		state[r.Instance] = st
	}
	if r.Seq <= st.seq {
		return fmt.Errorf("seq %d of instance %s is not above its previous record's %d", r.Seq, r.Instance, st.seq)
	}
	switch r.Phase {
	case testplugin.JournalBegin:
		if r.Call != r.Seq {
			return fmt.Errorf("begin record with call %d, not its own seq %d", r.Call, r.Seq)
		}
		st.begins[r.Call] = true
	case testplugin.JournalEnd:
		if r.Code == "" {
			return errors.New("end record without code")
		}
		if !st.begins[r.Call] {
			return fmt.Errorf("end record of call %d of instance %s without its begin record", r.Call, r.Instance)
		}
		delete(st.begins, r.Call)
	default:
		return fmt.Errorf("phase %q is not %q or %q", r.Phase, testplugin.JournalBegin, testplugin.JournalEnd)
	}
	st.seq = r.Seq
	return nil
}

// Merge reads the journal files and returns all their records ordered by
// time; records of the same instant keep the order of the files and of
// their lines. As with Read, a non-nil error comes with records only when
// it reports torn records (errors.Is(err, ErrTornLine)); any other error
// of any file returns no records.
func Merge(files ...string) ([]Record, error) {
	var (
		all  []Record
		torn []error
	)
	for _, f := range files {
		recs, err := Read(f)
		if err != nil && !errors.Is(err, ErrTornLine) {
			return nil, err
		}
		if err != nil {
			torn = append(torn, err)
		}
		all = append(all, recs...)
	}
	slices.SortStableFunc(all, func(a, b Record) int { return a.Time.Compare(b.Time) })
	return all, errors.Join(torn...)
}
