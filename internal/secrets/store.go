package secrets

import (
	"errors"
	"io/fs"
	"maps"
	"slices"
	"sync"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"
)

// Store holds the secrets file of each plugin that has one. It is safe
// for concurrent use.
type Store struct {
	log hclog.Logger

	mu    sync.RWMutex
	files map[string]*File // by plugin id
}

// NewStore returns an empty Store; logger (optional) receives a line per
// file read or kept, naming the file and its blocks' keys, never a value.
func NewStore(logger hclog.Logger) *Store {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Store{log: logger, files: map[string]*File{}}
}

// Load reads the secrets file of each plugin in paths (plugin id to
// path) and makes them the store's. A plugin left out of paths, or whose
// file is gone, has no secrets from then on: an operator who removes a
// file means it. A file that cannot be read otherwise or is refused keeps
// the plugin's secrets read last, if any, so that a typo does not cut the
// plugin off. The error joins each failure, naming the file.
func (s *Store) Load(paths map[string]string) error {
	read := make(map[string]*File, len(paths))
	gone := map[string]bool{}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(paths)) {
		f, err := Load(paths[id])
		if err != nil {
			errs = append(errs, err)
			gone[id] = errors.Is(err, fs.ErrNotExist)
			continue
		}
		read[id] = f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := make(map[string]*File, len(paths))
	for id, path := range paths {
		switch f, prev := read[id], s.files[id]; {
		case f != nil:
			next[id] = f
			s.log.Info("secrets file read", "plugin", id, "file", path, "keys", f.Keys())
		case gone[id]:
			s.log.Warn("secrets file is gone; the plugin's calls carry no secrets from it", "plugin", id, "file", path)
		case prev != nil:
			next[id] = prev
			s.log.Error("secrets file not read; the plugin keeps the secrets read before", "plugin", id, "file", path, "kept_from", prev.Path())
		}
	}
	for id, prev := range s.files {
		if _, ok := paths[id]; !ok {
			s.log.Info("secrets file no longer configured; the plugin's calls carry no secrets from it", "plugin", id, "file", prev.Path())
		}
	}
	s.files = next
	return errors.Join(errs...)
}

// Apply merges the secrets of pluginID's file into req, a CSI request:
// its class's block over default, under the secrets req already has. A
// plugin without a file, or a request without secrets, is left alone.
func (s *Store) Apply(pluginID string, req proto.Message) {
	if s == nil || req == nil {
		return
	}
	s.mu.RLock()
	f := s.files[pluginID]
	s.mu.RUnlock()
	if f != nil {
		merge(req, f)
	}
}

// Has reports whether pluginID has a secrets file read.
func (s *Store) Has(pluginID string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.files[pluginID] != nil
}
