package nodevolumes

import (
	"fmt"
	"os"
	"path/filepath"
)

// makeDirs creates r's staging target and the parent of its publish
// target. The plugin creates the publish target itself.
func (m *Manager) makeDirs(r *record) error {
	m.dirMu.Lock()
	defer m.dirMu.Unlock()
	if r.StagingPath != "" {
		if err := os.MkdirAll(r.StagingPath, dirMode); err != nil {
			return fmt.Errorf("volumes: create staging target: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(r.HostPath), dirMode); err != nil {
		return fmt.Errorf("volumes: create parent of the publish target: %w", err)
	}
	return nil
}

// removeTargetDirs removes r's publish target (when the plugin left an
// empty directory) and the volume's and workload's directories above it
// when they are empty.
func (m *Manager) removeTargetDirs(r *record) {
	m.dirMu.Lock()
	defer m.dirMu.Unlock()
	volDir := filepath.Dir(r.HostPath)
	removeEmpty(r.HostPath, volDir, filepath.Dir(volDir))
}

// removeStagingDirs removes r's staging target and the volume's staging
// directory when they are empty.
func (m *Manager) removeStagingDirs(r *record) {
	m.dirMu.Lock()
	defer m.dirMu.Unlock()
	removeEmpty(r.StagingPath, filepath.Dir(r.StagingPath))
}

// removeEmpty removes each of dirs, in order, that is an empty directory.
// Anything else (a file, a link, a directory with entries, a mount point)
// is left alone.
func removeEmpty(dirs ...string) {
	for _, d := range dirs {
		fi, err := os.Lstat(d)
		if err != nil || !fi.IsDir() {
			continue
		}
		_ = os.Remove(d) // fails, as wanted, when not empty
	}
}
