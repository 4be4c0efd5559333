package journal

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/testplugin"
)

// rec is a valid record of instance inst with sequence number seq; call 0
// makes a begin record, else an end record of that call.
func rec(inst string, seq, call uint64, at int) Record {
	r := Record{Seq: seq, Call: seq, Phase: testplugin.JournalBegin, Time: ms(at), Instance: inst, Plugin: "p", Node: "n-" + inst,
		Method: "NodePublishVolume", VolumeID: "v1", TargetPath: "/t"}
	if call != 0 {
		r.Call, r.Phase, r.Code = call, testplugin.JournalEnd, "OK"
	}
	return r
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.jsonl")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRead(t *testing.T) {
	whole := lines(t, rec("i1", 1, 0, 0), rec("i1", 2, 1, 1))
	tests := []struct {
		name    string
		content func(t *testing.T) string
		// wantSeqs are the instance:seq of the records read; nil with
		// wantErr not torn.
		wantSeqs []string
		// wantTorn are the lines reported torn.
		wantTorn []int
		// wantErr is part of a fatal error; "" for none.
		wantErr string
	}{
		{
			name:     "whole journal",
			content:  func(*testing.T) string { return whole },
			wantSeqs: []string{"i1:1@1", "i1:2@2"},
		},
		{
			name:    "empty file",
			content: func(*testing.T) string { return "" },
		},
		{
			name:     "torn last line",
			content:  func(*testing.T) string { return whole + `{"seq":3,"call":3,"pha` },
			wantSeqs: []string{"i1:1@1", "i1:2@2"},
			wantTorn: []int{3},
		},
		{
			name: "last record without its newline",
			content: func(t *testing.T) string {
				return whole + strings.TrimSuffix(lines(t, rec("i1", 3, 0, 2)), "\n")
			},
			wantSeqs: []string{"i1:1@1", "i1:2@2", "i1:3@3"},
		},
		{
			name: "torn line ended by a restarted plugin",
			content: func(t *testing.T) string {
				return whole + `{"seq":3,"ca` + "\n" + lines(t, rec("i2", 1, 0, 5), rec("i2", 2, 1, 6))
			},
			wantSeqs: []string{"i1:1@1", "i1:2@2", "i2:1@4", "i2:2@5"},
			wantTorn: []int{3},
		},
		{
			name: "torn line ended by a restarted plugin killed in its first write",
			content: func(t *testing.T) string {
				return whole + `{"seq":3,"ca` + "\n" + `{"seq":1` + "\n" + lines(t, rec("i3", 1, 0, 5))
			},
			wantSeqs: []string{"i1:1@1", "i1:2@2", "i3:1@5"},
			wantTorn: []int{3, 4},
		},
		{
			name:     "torn last line ended by a restarted plugin that wrote nothing",
			content:  func(*testing.T) string { return whole + `{"seq":3,"ca` + "\n" },
			wantSeqs: []string{"i1:1@1", "i1:2@2"},
			wantTorn: []int{3},
		},
		{
			name: "bad line followed by the same instance",
			content: func(t *testing.T) string {
				return lines(t, rec("i1", 1, 0, 0)) + "garbage\n" + lines(t, rec("i1", 2, 1, 1))
			},
			wantErr: ":2: bad record: not a JSON record",
		},
		{
			name: "unknown field",
			content: func(*testing.T) string {
				return whole + `{"seq":3,"call":3,"phase":"begin","time":"2026-01-02T03:04:05Z","instance":"i1","method":"M","secret":"x"}` + "\n"
			},
			wantErr: `:3: bad record: not a JSON record: json: unknown field "secret"`,
		},
		{
			name:    "sequence going back",
			content: func(t *testing.T) string { return whole + lines(t, rec("i1", 2, 0, 3)) },
			wantErr: ":3: bad record: seq 2 of instance i1 is not above its previous record's 2",
		},
		{
			name:    "end without begin",
			content: func(t *testing.T) string { return lines(t, rec("i1", 1, 0, 0), rec("i1", 2, 7, 1)) },
			wantErr: ":2: bad record: end record of call 7 of instance i1 without its begin record",
		},
		{
			name: "begin naming another call",
			content: func(t *testing.T) string {
				r := rec("i1", 1, 0, 0)
				r.Call = 5
				return lines(t, r)
			},
			wantErr: ":1: bad record: begin record with call 5",
		},
		{
			name: "unknown phase",
			content: func(t *testing.T) string {
				r := rec("i1", 1, 0, 0)
				r.Phase = "middle"
				return lines(t, r)
			},
			wantErr: `:1: bad record: phase "middle"`,
		},
		{
			name: "end without code",
			content: func(t *testing.T) string {
				r := rec("i1", 2, 1, 1)
				r.Code = ""
				return lines(t, rec("i1", 1, 0, 0), r)
			},
			wantErr: ":2: bad record: end record without code",
		},
		{
			name: "record without instance",
			content: func(t *testing.T) string {
				r := rec("i1", 1, 0, 0)
				r.Instance = ""
				return lines(t, r)
			},
			wantErr: ":1: bad record: no instance",
		},
		{
			name: "bad whole last record without its newline",
			content: func(t *testing.T) string {
				return whole + strings.TrimSuffix(lines(t, rec("i1", 1, 0, 2)), "\n")
			},
			wantErr: ":3: bad record: seq 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.content(t))
			recs, err := Read(path)
			if tt.wantErr != "" {
				if err == nil || errors.Is(err, ErrTornLine) || !strings.Contains(err.Error(), path+tt.wantErr) {
					t.Fatalf("Read error %v, want one containing %q", err, path+tt.wantErr)
				}
				if recs != nil {
					t.Fatalf("Read returned %d records with a fatal error", len(recs))
				}
				return
			}
			var torn []int
			for _, e := range unjoin(err) {
				var te *TornLineError
				if !errors.As(e, &te) || !errors.Is(e, ErrTornLine) || te.File != path {
					t.Fatalf("Read error %v, want only torn lines of %s", e, path)
				}
				torn = append(torn, te.Line)
			}
			if !slices.Equal(torn, tt.wantTorn) {
				t.Fatalf("torn lines %v, want %v (%v)", torn, tt.wantTorn, err)
			}
			var seqs []string
			for _, r := range recs {
				if r.File != path {
					t.Errorf("record file %q, want %q", r.File, path)
				}
				seqs = append(seqs, r.Instance+":"+itoa(r.Seq)+"@"+itoa(uint64(r.Line)))
			}
			if strings.Join(seqs, " ") != strings.Join(tt.wantSeqs, " ") {
				t.Fatalf("records %v, want %v", seqs, tt.wantSeqs)
			}
		})
	}
}

func TestReadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none")
	recs, err := Read(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) || recs != nil {
		t.Fatalf("Read of a missing file = %d records, %v; want a not-exist error", len(recs), err)
	}
}

func TestMerge(t *testing.T) {
	a := writeFile(t, lines(t, rec("a", 1, 0, 0), rec("a", 2, 1, 10), rec("a", 3, 0, 20))+`{"seq":4`)
	b := writeFile(t, lines(t, rec("b", 1, 0, 5), rec("b", 2, 1, 10), rec("b", 3, 0, 15)))
	bad := writeFile(t, "nonsense\n"+lines(t, rec("c", 2, 0, 0)))
	tests := []struct {
		name     string
		files    []string
		want     []string
		wantTorn bool
		wantErr  string
	}{
		{name: "by time, ties in file order", files: []string{a, b}, want: []string{"a:1", "b:1", "a:2", "b:2", "b:3", "a:3"}, wantTorn: true},
		{name: "file order breaks ties", files: []string{b, a}, want: []string{"a:1", "b:1", "b:2", "a:2", "b:3", "a:3"}, wantTorn: true},
		{name: "one bad file fails", files: []string{a, bad}, wantErr: bad + ":1: bad record"},
		{name: "no files", files: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := Merge(tt.files...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || recs != nil {
					t.Fatalf("Merge = %d records, %v; want no records and an error containing %q", len(recs), err, tt.wantErr)
				}
				return
			}
			if got := errors.Is(err, ErrTornLine); got != tt.wantTorn || (err != nil && !tt.wantTorn) {
				t.Fatalf("Merge error %v, want torn %t", err, tt.wantTorn)
			}
			var got []string
			for _, r := range recs {
				got = append(got, r.Instance+":"+itoa(r.Seq))
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("Merge order %v, want %v", got, tt.want)
			}
		})
	}
}

// unjoin returns the errors joined in err.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// FuzzRead checks Read never panics and, when it returns records, that
// they are the file's, in line order, each valid.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"seq":1,"call":1,"phase":"begin","time":"2026-01-02T03:04:05Z","instance":"i","method":"M"}` + "\n"))
	f.Add([]byte(`{"seq":1,"call":1,"phase":"begin","time":"2026-01-02T03:04:05Z","instance":"i","method":"M"}` + "\n{\"seq\":2,"))
	f.Add([]byte("{\"seq\":3,\"ca\n" + `{"seq":1,"call":1,"phase":"begin","time":"2026-01-02T03:04:05Z","instance":"j","method":"M"}`))
	f.Add([]byte("\n\n[1]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "j")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		recs, err := Read(path)
		if err != nil && !errors.Is(err, ErrTornLine) {
			if recs != nil {
				t.Fatalf("records with error %v", err)
			}
			return
		}
		last := 0
		for _, r := range recs {
			if r.File != path || r.Line <= last || r.Instance == "" || r.Seq == 0 {
				t.Fatalf("record %+v after line %d", r, last)
			}
			last = r.Line
		}
	})
}
