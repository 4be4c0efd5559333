package testplugin

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// State directory layout:
//
//	volumes/<id>.json    controller record of a volume
//	snapshots/<id>.json  record of a snapshot
//	node/<id>.json       node record of a staged or published volume
//	data/<id>/           the volume's directory; node targets link to it
//	snapdata/<id>/       the content of a snapshot, copied from its source
const (
	volumesDir   = "volumes"
	snapshotsDir = "snapshots"
	nodeDir      = "node"
	dataDir      = "data"
	snapDataDir  = "snapdata"
)

// idRE is the form of every volume and snapshot id the plugin accepts; it
// keeps ids safe as file names.
var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// volume is the controller record of a volume.
type volume struct {
	ID               string            `json:"id"`
	Name             string            `json:"name"`
	CapacityBytes    int64             `json:"capacity_bytes"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"source_snapshot_id,omitempty"`
	SourceVolumeID   string            `json:"source_volume_id,omitempty"`
	// CreateMutableParameters are the mutable parameters CreateVolume was
	// given, which a repeated CreateVolume must match; MutableParameters
	// are the current ones, changed by ControllerModifyVolume.
	CreateMutableParameters map[string]string      `json:"create_mutable_parameters,omitempty"`
	MutableParameters       map[string]string      `json:"mutable_parameters,omitempty"`
	Topology                map[string]string      `json:"topology,omitempty"`
	Published               map[string]publication `json:"published,omitempty"` // by node id
	CreatedAt               time.Time              `json:"created_at"`
}

// publication is one ControllerPublishVolume of a volume to a node.
type publication struct {
	AccessMode int32 `json:"access_mode"`
	Readonly   bool  `json:"readonly"`
}

// snapshot is the record of a snapshot.
type snapshot struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"source_volume_id"`
	SizeBytes      int64     `json:"size_bytes"`
	CreatedAt      time.Time `json:"created_at"`
	// NotReadyReports is how many more times the snapshot is reported
	// with ready_to_use=false (see Config.SnapshotReadyAfter).
	NotReadyReports int `json:"not_ready_reports,omitempty"`
}

// nodeVolume is the node record of a volume staged or published on this node.
type nodeVolume struct {
	ID            string            `json:"id"`
	StagingPath   string            `json:"staging_path,omitempty"`
	StageMode     int32             `json:"stage_mode,omitempty"`
	StageGroup    string            `json:"stage_mount_group,omitempty"`
	Targets       map[string]target `json:"targets,omitempty"` // by target path
	CapacityBytes int64             `json:"capacity_bytes,omitempty"`
}

// target is one NodePublishVolume of a volume.
type target struct {
	AccessMode int32  `json:"access_mode"`
	Readonly   bool   `json:"readonly"`
	MountGroup string `json:"mount_group,omitempty"`
}

// state is the plugin's records, kept in memory and written through to the
// state directory. mu guards the maps and the files.
type state struct {
	dir       string
	mu        sync.Mutex
	volumes   map[string]*volume
	snapshots map[string]*snapshot
	node      map[string]*nodeVolume
	volNames  map[string]string // volume name -> id
	snapNames map[string]string // snapshot name -> id
}

// openState creates the state directory layout and loads every record.
func openState(dir string) (*state, error) {
	for _, sub := range []string{volumesDir, snapshotsDir, nodeDir, dataDir, snapDataDir} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("testplugin: state dir %q: %w", dir, err)
		}
	}
	s := &state{
		dir:       dir,
		volumes:   make(map[string]*volume),
		snapshots: make(map[string]*snapshot),
		node:      make(map[string]*nodeVolume),
		volNames:  make(map[string]string),
		snapNames: make(map[string]string),
	}
	if err := loadRecords(filepath.Join(dir, volumesDir), s.volumes, func(v *volume) string { return v.ID }); err != nil {
		return nil, err
	}
	if err := loadRecords(filepath.Join(dir, snapshotsDir), s.snapshots, func(v *snapshot) string { return v.ID }); err != nil {
		return nil, err
	}
	if err := loadRecords(filepath.Join(dir, nodeDir), s.node, func(v *nodeVolume) string { return v.ID }); err != nil {
		return nil, err
	}
	for id, v := range s.volumes {
		s.volNames[v.Name] = id
	}
	for id, snap := range s.snapshots {
		s.snapNames[snap.Name] = id
	}
	return s, nil
}

// loadRecords reads every <id>.json file of dir into m.
func loadRecords[T any](dir string, m map[string]*T, id func(*T) string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("testplugin: read state dir %q: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		file := filepath.Join(dir, name)
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("testplugin: read record %q: %w", file, err)
		}
		rec := new(T)
		if err := json.Unmarshal(b, rec); err != nil {
			return fmt.Errorf("testplugin: decode record %q: %w", file, err)
		}
		if want := strings.TrimSuffix(name, ".json"); id(rec) != want {
			return fmt.Errorf("testplugin: record %q: id %q does not match its file name", file, id(rec))
		}
		m[id(rec)] = rec
	}
	return nil
}

// write stores rec as <kind>/<id>.json, atomically.
func (s *state) write(kind, id string, rec any) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("testplugin: encode %s record %q: %w", kind, id, err)
	}
	file := filepath.Join(s.dir, kind, id+".json")
	tmp := filepath.Join(s.dir, kind, "."+id+".json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("testplugin: write record %q: %w", file, err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("testplugin: write record %q: %w", file, err)
	}
	return nil
}

// remove deletes <kind>/<id>.json; a missing file is not an error.
func (s *state) remove(kind, id string) error {
	file := filepath.Join(s.dir, kind, id+".json")
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("testplugin: remove record %q: %w", file, err)
	}
	return nil
}

// volumeByName returns the volume called name, or nil.
func (s *state) volumeByName(name string) *volume {
	if id, ok := s.volNames[name]; ok {
		return s.volumes[id]
	}
	return nil
}

// snapshotByName returns the snapshot called name, or nil.
func (s *state) snapshotByName(name string) *snapshot {
	if id, ok := s.snapNames[name]; ok {
		return s.snapshots[id]
	}
	return nil
}

// usedCapacity is the sum of all volume sizes.
func (s *state) usedCapacity() int64 {
	var used int64
	for _, v := range s.volumes {
		used += v.CapacityBytes
	}
	return used
}

// publishedTo counts the volumes published to node.
func (s *state) publishedTo(node string) int64 {
	var n int64
	for _, v := range s.volumes {
		if _, ok := v.Published[node]; ok {
			n++
		}
	}
	return n
}

// putVolume writes v and indexes it.
func (s *state) putVolume(v *volume) error {
	if err := s.write(volumesDir, v.ID, v); err != nil {
		return err
	}
	s.volumes[v.ID] = v
	s.volNames[v.Name] = v.ID
	return nil
}

// deleteVolume removes v's record and directory.
func (s *state) deleteVolume(v *volume) error {
	if err := s.remove(volumesDir, v.ID); err != nil {
		return err
	}
	delete(s.volumes, v.ID)
	delete(s.volNames, v.Name)
	if err := os.RemoveAll(s.dataPath(v.ID)); err != nil {
		return fmt.Errorf("testplugin: remove volume directory: %w", err)
	}
	return nil
}

// putSnapshot writes snap and indexes it.
func (s *state) putSnapshot(snap *snapshot) error {
	if err := s.write(snapshotsDir, snap.ID, snap); err != nil {
		return err
	}
	s.snapshots[snap.ID] = snap
	s.snapNames[snap.Name] = snap.ID
	return nil
}

// deleteSnapshot removes snap's record and content.
func (s *state) deleteSnapshot(snap *snapshot) error {
	if err := s.remove(snapshotsDir, snap.ID); err != nil {
		return err
	}
	delete(s.snapshots, snap.ID)
	delete(s.snapNames, snap.Name)
	if err := os.RemoveAll(s.snapDataPath(snap.ID)); err != nil {
		return fmt.Errorf("testplugin: remove snapshot content: %w", err)
	}
	return nil
}

// putNode writes n, or removes its record when the volume is neither staged
// nor published any more.
func (s *state) putNode(n *nodeVolume) error {
	if n.StagingPath == "" && len(n.Targets) == 0 {
		if err := s.remove(nodeDir, n.ID); err != nil {
			return err
		}
		delete(s.node, n.ID)
		return nil
	}
	if err := s.write(nodeDir, n.ID, n); err != nil {
		return err
	}
	s.node[n.ID] = n
	return nil
}

// dataPath is the directory of volume id.
func (s *state) dataPath(id string) string {
	return filepath.Join(s.dir, dataDir, id)
}

// snapDataPath is the content directory of snapshot id.
func (s *state) snapDataPath(id string) string {
	return filepath.Join(s.dir, snapDataDir, id)
}

// newID returns prefix followed by 16 random hex digits.
func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return prefix + hex.EncodeToString(b)
}

// dirUsage returns the bytes and files under dir.
func dirUsage(dir string) (bytes, files int64, err error) {
	err = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			bytes += fi.Size()
		}
		files++
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("testplugin: usage of %q: %w", dir, err)
	}
	return bytes, files, nil
}
