package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/safefile"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// StateFileName is the registry's file in the data directory.
const StateFileName = "registry.json"

// stateFormatVersion is the version of the registry file format. Bump it on
// any incompatible change; a file of another version is set aside.
const stateFormatVersion = 1

// minSaveInterval is the shortest time between two writes of the registry
// file: changes in between are coalesced into one write.
const minSaveInterval = 500 * time.Millisecond

// stateFile is the content of the registry file.
type stateFile struct {
	Version int       `json:"version"`
	SavedAt time.Time `json:"saved_at"`
	Plugins []Plugin  `json:"plugins"`
}

// persister saves the registry to <DataDir>/registry.json and loads it.
type persister struct {
	path string
	reg  *Registry
	log  hclog.Logger

	saved uint64 // registry version of the latest write
}

func newPersister(dataDir string, reg *Registry, log hclog.Logger) *persister {
	return &persister{path: filepath.Join(dataDir, StateFileName), reg: reg, log: log}
}

// load reads the registry file and restores its plugins. A missing file is
// a first start. A file that cannot be read as a registry is renamed aside
// with a warning, so a damaged file never keeps the agent from starting.
func (p *persister) load() error {
	if err := os.MkdirAll(filepath.Dir(p.path), 0o700); err != nil {
		return fmt.Errorf("create data directory %q: %w", filepath.Dir(p.path), err)
	}
	plugins, err := readStateFile(p.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, errBadStateFile):
		aside := fmt.Sprintf("%s.corrupt-%s", p.path, time.Now().UTC().Format("20060102T150405Z"))
		if rerr := os.Rename(p.path, aside); rerr != nil {
			return fmt.Errorf("set aside unreadable registry file: %w (after: %w)", rerr, err)
		}
		p.log.Warn("registry file unreadable; set aside, starting with an empty registry",
			"error", err, "moved_to", aside)
		return nil
	case err != nil:
		return err
	}
	p.reg.Restore(plugins)
	p.saved = p.reg.Version()
	p.log.Info("registry restored", "file", p.path, "plugins", len(plugins))
	return nil
}

// errBadStateFile marks a registry file whose content is unusable.
var errBadStateFile = errors.New("unusable registry file")

// readStateFile returns the valid plugins of a registry file.
func readStateFile(path string) ([]Plugin, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read registry file: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%w %q: %w", errBadStateFile, path, err)
	}
	if f.Version != stateFormatVersion {
		return nil, fmt.Errorf("%w %q: format version %d, this agent reads version %d",
			errBadStateFile, path, f.Version, stateFormatVersion)
	}
	plugins := make([]Plugin, 0, len(f.Plugins))
	for _, pl := range f.Plugins {
		if !ids.ValidPluginID(pl.ID) || pl.Instance.Path == "" {
			continue
		}
		plugins = append(plugins, pl)
	}
	return plugins, nil
}

// run writes the registry after changes, at most every minSaveInterval,
// until ctx ends. The caller saves once more after the last change. With
// wd set it runs as the "registry persister" loop: a write that hangs (a
// stuck disk) stops its beats.
func (p *persister) run(ctx context.Context, wd *watchdog.Monitor) {
	l := wd.Loop("registry persister")
	defer l.Done()
	sub := p.reg.Subscribe()
	defer sub.Close()
	for {
		l.Beat()
		select {
		case <-ctx.Done():
			return
		case <-l.C():
			continue // idle: the beat above is the turn
		case <-sub.C():
		}
		if err := p.save(); err != nil {
			p.log.Warn("cannot save registry", "error", err)
		}
		// Let changes pile up: the next notification covers all of them.
		// The wait beats: it is longer than a short watchdog timeout.
		if l.Wait(ctx, minSaveInterval) != nil {
			return
		}
	}
}

// save writes the registry when it changed since the last write.
func (p *persister) save() error {
	v := p.reg.Version()
	if v == p.saved {
		return nil
	}
	f := stateFile{Version: stateFormatVersion, SavedAt: time.Now().UTC(), Plugins: p.reg.List()}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode registry: %w", err)
	}
	if err := safefile.WriteFile(p.path, data, 0o600); err != nil {
		return err
	}
	p.saved = v
	return nil
}
