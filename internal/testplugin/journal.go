package testplugin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"
)

// Phases of a journal record.
const (
	// JournalBegin is the phase of the record written when a call arrives,
	// before any delay, injected error or effect.
	JournalBegin = "begin"
	// JournalEnd is the phase of the record written when the call's work
	// is done, before its answer is sent.
	JournalEnd = "end"
)

// MaxJournalString bounds every string of a journal record, in bytes, so
// that a record stays small whatever a caller sends; longer strings are
// cut and end with "...".
const MaxJournalString = 4 << 10

// maxJournalSecretKeys bounds the secret keys a record lists.
const maxJournalSecretKeys = 32

// JournalRecord is one line of the call journal (Config.Journal): a JSON
// object. Every Node and Controller call gives two records, JournalBegin
// and JournalEnd, sharing Call; a call whose plugin died meanwhile has only
// its begin record. Request fields are repeated in the end record, so each
// record reads on its own.
type JournalRecord struct {
	// Seq numbers the records of one plugin instance from 1, in the order
	// they are written to the file.
	Seq uint64 `json:"seq"`
	// Call is the Seq of the call's begin record.
	Call uint64 `json:"call"`
	// Phase is JournalBegin or JournalEnd.
	Phase string `json:"phase"`
	// Time is the wall-clock time the record was made (RFC 3339 with
	// nanoseconds in JSON).
	Time time.Time `json:"time"`
	// Instance identifies the plugin instance (a Plugin value) that wrote
	// the record: random, new for every New, so Seq restarts with a new
	// Instance when a plugin process restarts on the same journal.
	Instance string `json:"instance"`
	// Plugin is the writer's Config.Name.
	Plugin string `json:"plugin"`
	// Node is the writer's Config.NodeID: the node on which a node call's
	// effect happens.
	Node string `json:"node"`
	// Method is the gRPC method name, for example "NodePublishVolume".
	Method string `json:"method"`
	// VolumeID is the request's volume_id (source_volume_id for
	// CreateSnapshot); in the end record of a successful CreateVolume,
	// the id of the volume created.
	VolumeID string `json:"volume_id,omitempty"`
	// NodeID is the node_id of a ControllerPublishVolume or
	// ControllerUnpublishVolume request.
	NodeID string `json:"node_id,omitempty"`
	// Name is the name of a CreateVolume or CreateSnapshot request.
	Name string `json:"name,omitempty"`
	// SnapshotID is the request's snapshot_id; in the end record of a
	// successful CreateSnapshot, the id of the snapshot created.
	SnapshotID string `json:"snapshot_id,omitempty"`
	// TargetPath and StagingPath are the request's target_path and
	// staging_target_path, VolumePath its volume_path.
	TargetPath  string `json:"target_path,omitempty"`
	StagingPath string `json:"staging_path,omitempty"`
	VolumePath  string `json:"volume_path,omitempty"`
	// Readonly is the request's readonly flag.
	Readonly bool `json:"readonly,omitempty"`
	// AccessMode is the CSI name of the request's access mode (for
	// example "SINGLE_NODE_WRITER"); for CreateVolume the first
	// capability's.
	AccessMode string `json:"access_mode,omitempty"`
	// SecretKeys are the sorted keys of the request's secrets (at most
	// 32); the values are never written.
	SecretKeys []string `json:"secret_keys,omitempty"`
	// Code is the gRPC code name of the call's outcome ("OK",
	// "FailedPrecondition"), in end records only. It is the outcome of the
	// work: an answer lost afterwards (Faults.AnswerDelays, a cancelled
	// caller) does not change it, since the effect is there.
	Code string `json:"code,omitempty"`
	// Message is the error message of a failed call, in end records only.
	Message string `json:"message,omitempty"`

	// File and Line are where a reader found the record; not written.
	File string `json:"-"`
	Line int    `json:"-"`
}

// journal appends the call records of one plugin instance to its file.
// Records are written one write(2) each on an O_APPEND descriptor, so
// several instances may share a file, and synced before the call goes on.
type journal struct {
	path     string
	instance string
	plugin   string
	node     string

	mu  sync.Mutex
	f   *os.File // nil while the plugin is not serving
	seq uint64
}

func newJournal(path, plugin, node string) *journal {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return &journal{path: path, instance: hex.EncodeToString(b), plugin: plugin, node: node}
}

// open opens the journal for appending, creating the file and its
// directory when missing. A file ending in a torn record (a process killed
// mid-write) gets a newline first, so the fragment stays a line of its own
// that readers can recognise and skip, rather than being glued to the next
// record.
func (j *journal) open() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(j.path), 0o755); err != nil {
		return fmt.Errorf("testplugin: journal %q: create directory: %w", j.path, err)
	}
	_, statErr := os.Stat(j.path)
	f, err := os.OpenFile(j.path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("testplugin: journal %q: %w", j.path, err)
	}
	if errors.Is(statErr, os.ErrNotExist) {
		// Make the new file's name durable too, not only its records.
		if d, err := os.Open(filepath.Dir(j.path)); err == nil {
			_ = d.Sync()
			_ = d.Close()
		}
	}
	if err := terminateTornLine(f); err != nil {
		f.Close()
		return fmt.Errorf("testplugin: journal %q: %w", j.path, err)
	}
	j.f = f
	return nil
}

// terminateTornLine appends a newline to a regular file whose last byte is
// not one.
func terminateTornLine(f *os.File) error {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, fi.Size()-1); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if last[0] == '\n' {
		return nil
	}
	if _, err := f.Write([]byte{'\n'}); err != nil {
		return err
	}
	return f.Sync()
}

// close closes the file; records written afterwards fail until open.
func (j *journal) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
}

// write numbers r, stamps it, appends it as one line and syncs it. The
// lock is held through the sync so that the file's order is Seq order.
func (j *journal) write(r *JournalRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return fmt.Errorf("journal %q is closed: the plugin is not serving", j.path)
	}
	j.seq++
	r.Seq = j.seq
	if r.Phase == JournalBegin {
		r.Call = r.Seq
	}
	r.Time = time.Now().UTC()
	r.Instance, r.Plugin, r.Node = j.instance, j.plugin, j.node
	line, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("journal %q: encode record: %w", j.path, err)
	}
	line = append(line, '\n')
	if _, err := j.f.Write(line); err != nil {
		return fmt.Errorf("journal %q: write: %w", j.path, err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("journal %q: sync: %w", j.path, err)
	}
	return nil
}

// journaled reports whether calls of the gRPC method fullMethod go to the
// journal: those of the Node and Controller services.
func journaled(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/csi.v1.Node/") || strings.HasPrefix(fullMethod, "/csi.v1.Controller/")
}

// journalRequest returns the record of a call of method with request req:
// the request fields the invariant checks need, cut to MaxJournalString,
// and the keys of its secrets only.
func journalRequest(method string, req any) JournalRecord {
	r := JournalRecord{Method: method}
	if v, ok := req.(interface{ GetVolumeId() string }); ok {
		r.VolumeID = v.GetVolumeId()
	}
	if v, ok := req.(interface{ GetSourceVolumeId() string }); ok {
		r.VolumeID = v.GetSourceVolumeId() // CreateSnapshot
	}
	switch v := req.(type) {
	case *csi.ControllerPublishVolumeRequest:
		r.NodeID = v.GetNodeId()
	case *csi.ControllerUnpublishVolumeRequest:
		r.NodeID = v.GetNodeId()
	case *csi.CreateVolumeRequest:
		if cs := v.GetVolumeCapabilities(); len(cs) > 0 {
			r.AccessMode = accessModeName(cs[0])
		}
	}
	if v, ok := req.(interface{ GetName() string }); ok {
		r.Name = v.GetName()
	}
	if v, ok := req.(interface{ GetSnapshotId() string }); ok {
		r.SnapshotID = v.GetSnapshotId()
	}
	if v, ok := req.(interface{ GetTargetPath() string }); ok {
		r.TargetPath = v.GetTargetPath()
	}
	if v, ok := req.(interface{ GetStagingTargetPath() string }); ok {
		r.StagingPath = v.GetStagingTargetPath()
	}
	if v, ok := req.(interface{ GetVolumePath() string }); ok {
		r.VolumePath = v.GetVolumePath()
	}
	if v, ok := req.(interface{ GetReadonly() bool }); ok {
		r.Readonly = v.GetReadonly()
	}
	if v, ok := req.(interface {
		GetVolumeCapability() *csi.VolumeCapability
	}); ok && v.GetVolumeCapability() != nil {
		r.AccessMode = accessModeName(v.GetVolumeCapability())
	}
	if v, ok := req.(interface{ GetSecrets() map[string]string }); ok && len(v.GetSecrets()) > 0 {
		keys := slices.Sorted(maps.Keys(v.GetSecrets()))
		if len(keys) > maxJournalSecretKeys {
			keys = keys[:maxJournalSecretKeys]
		}
		for i := range keys {
			keys[i] = capString(keys[i])
		}
		r.SecretKeys = keys
	}
	for _, s := range []*string{&r.VolumeID, &r.NodeID, &r.Name, &r.SnapshotID, &r.TargetPath, &r.StagingPath, &r.VolumePath} {
		*s = capString(*s)
	}
	return r
}

func accessModeName(c *csi.VolumeCapability) string {
	if c.GetAccessMode() == nil {
		return ""
	}
	return c.GetAccessMode().GetMode().String()
}

// journalOutcome completes the end record r with the outcome of the call:
// its code and message, and the ids a create call made.
func journalOutcome(r *JournalRecord, resp any, err error) {
	r.Phase = JournalEnd
	st := status.Convert(err)
	r.Code = st.Code().String()
	r.Message = capString(st.Message())
	if err != nil {
		return
	}
	switch v := resp.(type) {
	case *csi.CreateVolumeResponse:
		r.VolumeID = capString(v.GetVolume().GetVolumeId())
	case *csi.CreateSnapshotResponse:
		r.SnapshotID = capString(v.GetSnapshot().GetSnapshotId())
	}
}

// capString cuts s to MaxJournalString bytes.
func capString(s string) string {
	if len(s) <= MaxJournalString {
		return s
	}
	return strings.ToValidUTF8(s[:MaxJournalString-3], "") + "..."
}
