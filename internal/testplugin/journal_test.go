package testplugin

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// readJournal decodes every line of the journal at path; the reader
// package cannot be used here, as it imports this one.
func readJournal(t *testing.T, path string) []JournalRecord {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []JournalRecord
	for i, line := range bytes.Split(bytes.TrimSuffix(data, []byte{'\n'}), []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		var r JournalRecord
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("%s:%d: %v: %s", path, i+1, err, line)
		}
		out = append(out, r)
	}
	return out
}

// journalPlugin starts a monolith plugin journaling to a new file and
// returns it with its client and journal path.
func journalPlugin(t *testing.T) (*Plugin, *client, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal", "calls.jsonl")
	p := startPlugin(t, Config{Journal: path, Name: "journal.test", KnownNodeIDs: []string{"node-b"},
		ControllerCapabilities: SupportedControllerCapabilities})
	return p, dial(t, p.Socket()), path
}

const secretMarker = "s3cret-marker-value"

func TestJournalRecords(t *testing.T) {
	_, c, path := journalPlugin(t)
	secrets := map[string]string{"password": secretMarker, "user": secretMarker + "-user"}
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	ro := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER)

	vol, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "journaled", VolumeCapabilities: []*csi.VolumeCapability{snw}, Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	if _, err := c.id.GetPluginInfo(ctx(t), &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func() error
		want JournalRecord // the end record's fields beyond the common ones
	}{
		{"controller publish", func() error {
			_, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-b", VolumeCapability: snw, Secrets: secrets})
			return err
		}, JournalRecord{Method: "ControllerPublishVolume", VolumeID: id, NodeID: "node-b", AccessMode: "SINGLE_NODE_WRITER", SecretKeys: []string{"password", "user"}, Code: "OK"}},
		{"stage", func() error {
			_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: ro, Secrets: secrets})
			return err
		}, JournalRecord{Method: "NodeStageVolume", VolumeID: id, StagingPath: staging, AccessMode: "MULTI_NODE_SINGLE_WRITER", SecretKeys: []string{"password", "user"}, Code: "OK"}},
		{"publish read-only", func() error {
			_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: ro, Readonly: true, Secrets: secrets})
			return err
		}, JournalRecord{Method: "NodePublishVolume", VolumeID: id, StagingPath: staging, TargetPath: target, Readonly: true, AccessMode: "MULTI_NODE_SINGLE_WRITER", SecretKeys: []string{"password", "user"}, Code: "OK"}},
		{"publish refused", func() error {
			_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging + "x", TargetPath: target + "x", VolumeCapability: snw})
			return err
		}, JournalRecord{Method: "NodePublishVolume", VolumeID: id, StagingPath: staging + "x", TargetPath: target + "x", AccessMode: "SINGLE_NODE_WRITER", Code: "FailedPrecondition"}},
		{"stats", func() error {
			_, err := c.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			return err
		}, JournalRecord{Method: "NodeGetVolumeStats", VolumeID: id, VolumePath: target, Code: "OK"}},
		{"unpublish", func() error {
			_, err := c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}, JournalRecord{Method: "NodeUnpublishVolume", VolumeID: id, TargetPath: target, Code: "OK"}},
		{"unstage", func() error {
			_, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			return err
		}, JournalRecord{Method: "NodeUnstageVolume", VolumeID: id, StagingPath: staging, Code: "OK"}},
		{"controller unpublish", func() error {
			_, err := c.ctrl.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-b"})
			return err
		}, JournalRecord{Method: "ControllerUnpublishVolume", VolumeID: id, NodeID: "node-b", Code: "OK"}},
		{"node info", func() error {
			_, err := c.node.NodeGetInfo(ctx(t), &csi.NodeGetInfoRequest{})
			return err
		}, JournalRecord{Method: "NodeGetInfo", Code: "OK"}},
		{"snapshot", func() error {
			_, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "snap"})
			return err
		}, JournalRecord{Method: "CreateSnapshot", VolumeID: id, Name: "snap", Code: "OK"}},
		{"delete", func() error {
			_, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}, JournalRecord{Method: "DeleteVolume", VolumeID: id, Code: "OK"}},
	}
	for _, tt := range calls {
		before := len(readJournal(t, path))
		if err := tt.call(); status.Code(err).String() != tt.want.Code {
			t.Fatalf("%s: %v, want code %s", tt.name, err, tt.want.Code)
		}
		recs := readJournal(t, path)[before:]
		if len(recs) != 2 {
			t.Fatalf("%s: %d records, want a begin and an end: %+v", tt.name, len(recs), recs)
		}
		begin, end := recs[0], recs[1]
		if begin.Phase != JournalBegin || end.Phase != JournalEnd || begin.Call != begin.Seq || end.Call != begin.Seq ||
			end.Seq != begin.Seq+1 || end.Time.Before(begin.Time) || begin.Code != "" {
			t.Fatalf("%s: begin %+v and end %+v do not pair", tt.name, begin, end)
		}
		if tt.name == "publish refused" && !strings.Contains(end.Message, "not staged") {
			t.Errorf("%s: message %q, want the error's", tt.name, end.Message)
		}
		if tt.name == "snapshot" && end.SnapshotID == "" {
			t.Errorf("%s: end record names no snapshot id", tt.name)
		}
		for _, r := range recs {
			got := r
			got.Seq, got.Call, got.Phase, got.Time, got.Instance, got.Plugin, got.Node, got.Message, got.SnapshotID = 0, 0, "", time.Time{}, "", "", "", "", ""
			want := tt.want
			if r.Phase == JournalBegin {
				want.Code = ""
			}
			if !jsonEqual(t, got, want) {
				t.Errorf("%s %s record:\n got %+v\nwant %+v", tt.name, r.Phase, got, want)
			}
			if r.Plugin != "journal.test" || r.Node != "node-a" || r.Instance == "" || r.Time.Location() != time.UTC {
				t.Errorf("%s: writer fields %q %q %q %v", tt.name, r.Plugin, r.Node, r.Instance, r.Time)
			}
		}
	}

	all := readJournal(t, path)
	// CreateVolume's records come first: its end names the volume made.
	if cv := all[1]; cv.Method != "CreateVolume" || cv.Phase != JournalEnd || cv.VolumeID != id || cv.Name != "journaled" ||
		!slices.Equal(cv.SecretKeys, []string{"password", "user"}) {
		t.Errorf("CreateVolume end record %+v, want volume %s", cv, id)
	}
	for i, r := range all {
		if r.Seq != uint64(i+1) || r.Instance != all[0].Instance {
			t.Fatalf("record %d has seq %d of instance %s, want %d of %s", i, r.Seq, r.Instance, i+1, all[0].Instance)
		}
		if strings.HasPrefix(r.Method, "GetPlugin") || r.Method == "Probe" {
			t.Errorf("identity call %s journaled", r.Method)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(secretMarker)) {
		t.Fatalf("journal holds a secret value:\n%s", data)
	}
}

// jsonEqual compares records as the journal writes them.
func jsonEqual(t *testing.T, a, b JournalRecord) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

func TestJournalCapsStrings(t *testing.T) {
	_, c, path := journalPlugin(t)
	long := strings.Repeat("v", 3*MaxJournalString)
	_, err := c.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: long})
	wantCode(t, err, codes.NotFound)
	for _, r := range readJournal(t, path) {
		if len(r.VolumeID) != MaxJournalString || !strings.HasSuffix(r.VolumeID, "...") {
			t.Errorf("%s record's volume id has %d bytes, want %d ending in ...", r.Phase, len(r.VolumeID), MaxJournalString)
		}
		if len(r.Message) > MaxJournalString {
			t.Errorf("%s record's message has %d bytes, more than %d", r.Phase, len(r.Message), MaxJournalString)
		}
	}
}

// TestJournalRestartAppends checks a plugin started again on the same
// journal adds to it: after Stop and New (a new process) with a new
// instance and sequence, after Kill and Start (the same instance) going on
// with its sequence.
func TestJournalRestartAppends(t *testing.T) {
	tests := []struct {
		name         string
		restart      func(t *testing.T, p *Plugin) *Plugin
		sameInstance bool
	}{
		{"stop and new", func(t *testing.T, p *Plugin) *Plugin {
			p.Stop()
			return startPlugin(t, p.Config())
		}, false},
		{"kill and start", func(t *testing.T, p *Plugin) *Plugin {
			p.Kill()
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			return p
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, c, path := journalPlugin(t)
			createVolume(t, c, "first", 1<<20)
			first, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			p = tt.restart(t, p)
			createVolume(t, dial(t, p.Socket()), "second", 1<<20)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(data, first) {
				t.Fatalf("the journal before the restart was not kept:\nbefore %s\nafter %s", first, data)
			}
			recs := readJournal(t, path)
			if len(recs) != 4 {
				t.Fatalf("%d records, want 4: %+v", len(recs), recs)
			}
			wantSeq, same := uint64(1), recs[2].Instance == recs[0].Instance
			if tt.sameInstance {
				wantSeq = 3
			}
			if same != tt.sameInstance || recs[2].Seq != wantSeq || recs[3].Name != "second" {
				t.Fatalf("records after the restart %+v and %+v, want seq %d, same instance %t", recs[2], recs[3], wantSeq, tt.sameInstance)
			}
		})
	}
}

// TestJournalTornTail checks a plugin started on a journal ending in a
// torn record puts its records on lines of their own.
func TestJournalTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	torn := `{"seq":7,"call":7,"pha`
	if err := os.WriteFile(path, []byte(torn), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startPlugin(t, Config{Journal: path})
	createVolume(t, dial(t, p.Socket()), "v", 1<<20)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 3 || lines[0] != torn || !strings.HasPrefix(lines[1], `{"seq":1,`) {
		t.Fatalf("journal lines %q, want the torn line then two records", lines)
	}
}

// TestJournalWriteFailure checks a call whose record cannot be written
// fails with Internal: without effect when the begin record fails.
func TestJournalWriteFailure(t *testing.T) {
	const full = "/dev/full" // every write fails with ENOSPC
	if _, err := os.Stat(full); err != nil {
		t.Skipf("no %s: %v", full, err)
	}
	p := startPlugin(t, Config{Journal: full})
	c := dial(t, p.Socket())
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"create volume", func() error {
			_, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{snw}})
			return err
		}, codes.Internal},
		{"node info", func() error {
			_, err := c.node.NodeGetInfo(ctx(t), &csi.NodeGetInfoRequest{})
			return err
		}, codes.Internal},
		{"identity is not journaled", func() error {
			_, err := c.id.GetPluginInfo(ctx(t), &csi.GetPluginInfoRequest{})
			return err
		}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, tt.want)
			if tt.want == codes.Internal && !strings.Contains(err.Error(), "not done") {
				t.Fatalf("error %v does not say the call was not done", err)
			}
		})
	}
	if v := p.Volumes(); len(v) != 0 {
		t.Fatalf("a call whose begin record failed made volumes %+v", v)
	}
}

// TestJournalEndFailure checks a call whose end record cannot be written
// fails with Internal although its effect is there, and that its begin
// record stays to cover it.
func TestJournalEndFailure(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	p := startPlugin(t, Config{Journal: path})
	c := dial(t, p.Socket())
	// The delay holds the call between its begin record and its work
	// while the test closes the journal.
	p.SetFaults(Faults{Delays: map[string]time.Duration{"CreateVolume": 3 * time.Second}})
	errc := make(chan error, 1)
	go func() {
		_, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{snw}})
		errc <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the begin record", func() bool {
		data, _ := os.ReadFile(path)
		return bytes.Contains(data, []byte(`"phase":"begin"`))
	})
	p.closeJournal()
	err := <-errc
	wantCode(t, err, codes.Internal)
	if !strings.Contains(err.Error(), "done with code OK but not journaled") {
		t.Fatalf("error %v does not say the work was done", err)
	}
	if len(p.Volumes()) != 1 {
		t.Fatalf("volumes %+v, want the one made", p.Volumes())
	}
	if recs := readJournal(t, path); len(recs) != 1 || recs[0].Phase != JournalBegin {
		t.Fatalf("journal %+v, want the begin record alone", recs)
	}
}
