package nodeclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/csisupd/csisupd/internal/safefile"
)

// LeaseFileName is the file in the agent's data_dir that holds the leases
// the agent renews (Leases), so that a restarted agent renews them again.
const LeaseFileName = "leases.json"

// leaseFileVersion is the version of the lease file's format. A file of
// another version is an error: an agent never renews, nor drops, leases
// it cannot read.
const leaseFileVersion = 1

// maxLeaseFileSize caps the lease file: MaxHeldWorkloads workloads with a
// few volumes each fit many times over.
const maxLeaseFileSize = 16 << 20

// leaseFileSpec is how the lease file is read: it names no secret, but it
// is the agent's own state and must not wedge its start.
var leaseFileSpec = safefile.Spec{What: "lease file", MaxSize: maxLeaseFileSize}

// leaseFile is the content of the lease file.
type leaseFile struct {
	Version int         `json:"version"`
	Holds   []heldLease `json:"holds"`
}

// heldLease is one Hold in the lease file.
type heldLease struct {
	VolumeID   string `json:"volume_id"`
	WorkloadID string `json:"workload_id"`
	// Lease is a Go duration ("30s"), readable by whoever looks at the
	// file.
	Lease string `json:"lease"`
}

// leaseFilePath is the lease file of the data directory dataDir.
func leaseFilePath(dataDir string) string { return filepath.Join(dataDir, LeaseFileName) }

// readLeaseFile returns the holds of the lease file at path: none when
// there is no file. Every error names the file and what is wrong.
func readLeaseFile(ctx context.Context, path string) (map[string]map[string]time.Duration, error) {
	holds := map[string]map[string]time.Duration{}
	data, err := safefile.Read(ctx, path, leaseFileSpec)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return holds, nil
	case err != nil:
		return nil, err // safefile names the file
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("lease file %s: %s; fix or remove it (its leases then run out on the servers)", path, fmt.Sprintf(format, args...))
	}
	var f leaseFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, bad("not a lease file: %v", err)
	}
	if f.Version != leaseFileVersion {
		return nil, bad("format version %d, this agent reads version %d", f.Version, leaseFileVersion)
	}
	for i, h := range f.Holds {
		lease, err := time.ParseDuration(h.Lease)
		if err != nil {
			return nil, bad("hold %d: lease %q is no duration", i, h.Lease)
		}
		if err := checkHold(h.VolumeID, h.WorkloadID, lease); err != nil {
			return nil, bad("hold %d: %v", i, err)
		}
		if _, dup := holds[h.WorkloadID][h.VolumeID]; dup {
			return nil, bad("hold %d: volume %s of workload %s is held twice", i, h.VolumeID, h.WorkloadID)
		}
		if holds[h.WorkloadID] == nil {
			holds[h.WorkloadID] = map[string]time.Duration{}
		}
		holds[h.WorkloadID][h.VolumeID] = lease
	}
	if len(holds) > MaxHeldWorkloads {
		return nil, bad("%d workloads held, more than the %d one agent holds", len(holds), MaxHeldWorkloads)
	}
	return holds, nil
}

// writeLeaseFile replaces the lease file at path with holds, atomically
// and readable by the agent's user alone.
func writeLeaseFile(path string, holds map[string]map[string]time.Duration) error {
	f := leaseFile{Version: leaseFileVersion, Holds: []heldLease{}}
	for _, h := range flatten(holds) {
		f.Holds = append(f.Holds, heldLease{VolumeID: h.VolumeID, WorkloadID: h.WorkloadID, Lease: h.Lease.String()})
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode lease file %s: %w", path, err)
	}
	if err := safefile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("lease file: %w", err)
	}
	return nil
}
