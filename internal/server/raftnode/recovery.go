package raftnode

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/csisupd/csisupd/internal/safefile"
	"github.com/csisupd/csisupd/internal/server/fsm"
)

// Names inside a server's data dir.
const (
	// raftDirName is the directory of the raft log, stable store and
	// snapshots.
	raftDirName = "raft"
	// raftDBName is the bolt file of the raft log and stable store.
	raftDBName = "raft.db"
	// PeersFileName is the file in the raft directory that, when present
	// at start, replaces the raft configuration: the manual recovery of a
	// cluster that lost its quorum for good.
	PeersFileName = "peers.json"
)

// maxPeersFileSize caps what is read of a peers.json file: a few hundred
// bytes per server.
const maxPeersFileSize = 1 << 20

// RaftDir returns the raft directory of a server whose data dir is
// dataDir; peers.json goes there.
func RaftDir(dataDir string) string { return filepath.Join(dataDir, raftDirName) }

// RecoveryPeer is one server of a peers.json file, in the format of
// Consul's and Nomad's raft protocol 3 peers.json.
type RecoveryPeer struct {
	// ID is the server's raft id (its node id).
	ID string `json:"id"`
	// Address is the server's raft address, host:port.
	Address string `json:"address"`
	// NonVoter makes the server a non-voting member.
	NonVoter bool `json:"non_voter"`
}

// readPeersFile reads and validates the peers.json at path for the server
// selfID advertising selfAddr. Every error names the file and, when one
// entry is at fault, the entry.
func readPeersFile(path, selfID, selfAddr string) (raft.Configuration, error) {
	// A FIFO there would block the server's start in its open: safefile
	// refuses it, naming it.
	data, err := safefile.Read(context.Background(), path, safefile.Spec{What: "server: peers file", MaxSize: maxPeersFileSize})
	if err != nil {
		return raft.Configuration{}, err
	}
	peers, err := parsePeers(data)
	if err != nil {
		return raft.Configuration{}, fmt.Errorf("server: %s: %w", path, err)
	}
	conf, err := peersConfiguration(peers, selfID, selfAddr)
	if err != nil {
		return raft.Configuration{}, fmt.Errorf("server: %s: %w", path, err)
	}
	return conf, nil
}

// parsePeers decodes a peers.json document. Unknown fields are refused: a
// misspelt "non_voter" would otherwise silently make a voter.
func parsePeers(data []byte) ([]RecoveryPeer, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON array of servers: %w", err)
	}
	if len(raw) == 0 {
		return nil, errors.New("lists no servers")
	}
	peers := make([]RecoveryPeer, len(raw))
	for i, r := range raw {
		if t := bytes.TrimSpace(r); len(t) > 0 && t[0] != '{' {
			return nil, fmt.Errorf("entry %d is not an object {\"id\", \"address\", \"non_voter\"} (a list of addresses is the old raft protocol 2 format, which is not supported)", i+1)
		}
		dec := json.NewDecoder(bytes.NewReader(r))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&peers[i]); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i+1, err)
		}
	}
	return peers, nil
}

// peersConfiguration validates peers as the configuration a server selfID
// advertising selfAddr may recover to, and returns it.
func peersConfiguration(peers []RecoveryPeer, selfID, selfAddr string) (raft.Configuration, error) {
	var (
		conf   raft.Configuration
		ids    = map[string]int{}
		addrs  = map[string]int{}
		voters int
		self   *RecoveryPeer
	)
	for i, p := range peers {
		n := i + 1
		if strings.TrimSpace(p.ID) == "" {
			return conf, fmt.Errorf("entry %d has an empty id", n)
		}
		if p.ID != strings.TrimSpace(p.ID) {
			return conf, fmt.Errorf("entry %d: id %q has surrounding spaces", n, p.ID)
		}
		if err := checkRaftAddress(p.Address); err != nil {
			return conf, fmt.Errorf("entry %d (id %q): %w", n, p.ID, err)
		}
		if prev, ok := ids[p.ID]; ok {
			return conf, fmt.Errorf("entry %d: id %q is also the id of entry %d", n, p.ID, prev)
		}
		if prev, ok := addrs[p.Address]; ok {
			return conf, fmt.Errorf("entry %d (id %q): address %s is also the address of entry %d", n, p.ID, p.Address, prev)
		}
		ids[p.ID], addrs[p.Address] = n, n
		suffrage := raft.Voter
		if p.NonVoter {
			suffrage = raft.Nonvoter
		} else {
			voters++
		}
		if p.ID == selfID {
			self = &peers[i]
		}
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: suffrage, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address)})
	}
	if voters == 0 {
		return conf, errors.New("lists no voter: at least one server must have \"non_voter\": false")
	}
	if self == nil {
		return conf, fmt.Errorf("does not list this server (id %q); write the file on the surviving servers only, each listed by its id", selfID)
	}
	if self.Address != selfAddr {
		return conf, fmt.Errorf("lists this server (id %q) at %s, but it advertises raft address %s", selfID, self.Address, selfAddr)
	}
	return conf, nil
}

// checkRaftAddress reports whether addr is a host:port raft can dial.
func checkRaftAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("address %q has no host", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("address %q: port %q is not a number between 1 and 65535", addr, port)
	}
	return nil
}

// recoverFromPeersFile replaces the raft configuration with the one in
// dir/peers.json when that file exists, before raft starts. It is the
// only way back for a cluster that lost its quorum for good. The file is
// removed once the recovery succeeded; a bad file is kept and stops the
// server from starting, so that no half-recovered server runs.
func (n *Node) recoverFromPeersFile(rc *raft.Config, dir string, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore) error {
	path := filepath.Join(dir, PeersFileName)
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("server: %s: %w", path, err)
	}
	conf, err := readPeersFile(path, n.cfg.ID, n.raftAddr)
	if err != nil {
		return err
	}
	n.logger.Warn("found peers.json: replacing the raft configuration (outage recovery)", "file", path, "servers", describeServers(conf))
	// raft restores the FSM it is given from the state on disk and then
	// does not use it again; a scratch FSM keeps that replay out of the
	// server's event buffer. NewRaft then restores the server's own FSM
	// from the snapshot the recovery wrote.
	events, err := fsm.NewEvents(n.cfg.ScratchEvents, hclog.NewNullLogger())
	if err != nil {
		return fmt.Errorf("server: recover from %s: %w", path, err)
	}
	defer events.Close()
	scratch, err := fsm.New(fsm.Config{Events: events})
	if err != nil {
		return fmt.Errorf("server: recover from %s: %w", path, err)
	}
	if err := raft.RecoverCluster(rc, scratch, logs, stable, snaps, n.trans, conf); err != nil {
		return fmt.Errorf("server: recover the raft configuration from %s (the file is kept): %w", path, err)
	}
	last, err := logs.LastIndex()
	if err != nil {
		return fmt.Errorf("server: recover from %s: last index: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		// Left in place, the file would replace the configuration again
		// at the next start, undoing the joins made since.
		return fmt.Errorf("server: recovered from %s but could not remove it; remove it before starting again: %w", path, err)
	}
	n.logger.Warn("recovered the raft configuration from peers.json and removed the file",
		"file", path, "servers", describeServers(conf), "last_index", last, "applied_index", scratch.State().LatestIndex())
	return nil
}

// describeServers renders a configuration for logs: id=address(suffrage).
func describeServers(conf raft.Configuration) string {
	parts := make([]string, len(conf.Servers))
	for i, srv := range conf.Servers {
		parts[i] = fmt.Sprintf("%s=%s(%s)", srv.ID, srv.Address, SuffrageName(srv.Suffrage))
	}
	return strings.Join(parts, ",")
}

// Names of suffrages, as list-peers and the metrics show them.
const (
	SuffrageVoter    = "voter"
	SuffrageNonvoter = "nonvoter"
)

// SuffrageName is the name list-peers uses for a suffrage: voter,
// nonvoter or staging.
func SuffrageName(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return SuffrageVoter
	case raft.Nonvoter:
		return SuffrageNonvoter
	default:
		return strings.ToLower(s.String())
	}
}

// OfflinePeer is one server of the raft configuration read from a
// stopped server's data dir.
type OfflinePeer struct {
	// ID is the server's raft id.
	ID string `json:"id"`
	// Address is its raft address.
	Address string `json:"address"`
	// Suffrage is "voter", "nonvoter" or "staging".
	Suffrage string `json:"suffrage"`
}

// OfflineRaftState is what a stopped server's data dir says about its
// raft cluster.
type OfflineRaftState struct {
	// RaftDir is the raft directory that was read.
	RaftDir string `json:"raft_dir"`
	// Servers is the last configuration the server knew, committed or
	// not.
	Servers []OfflinePeer `json:"servers"`
	// ConfigurationIndex is the raft index of that configuration.
	ConfigurationIndex uint64 `json:"configuration_index"`
	// ConfigurationSource says where it was found: "snapshot ID" or "log".
	ConfigurationSource string `json:"configuration_source"`
	// LastIndex and LastTerm are those of the last log entry, or of the
	// newest snapshot when the log holds nothing after it.
	LastIndex uint64 `json:"last_index"`
	LastTerm  uint64 `json:"last_term"`
	// SnapshotID is the newest snapshot's id; empty without snapshots.
	SnapshotID string `json:"snapshot_id"`
	// PeersFilePending reports that a peers.json waits for the next start.
	PeersFilePending bool `json:"peers_file_pending"`
}

// PeersFile returns the servers as a peers.json document lists them,
// keeping only the ids in keep when keep is not empty. Staging servers
// are written as non-voters.
func (st OfflineRaftState) PeersFile(keep []string) ([]RecoveryPeer, error) {
	want := map[string]bool{}
	ids := make([]string, len(keep))
	for i, id := range keep {
		ids[i] = strings.TrimSpace(id) // "a, b" from a shell
		want[ids[i]] = true
	}
	out := []RecoveryPeer{}
	for _, p := range st.Servers {
		if len(ids) > 0 && !want[p.ID] {
			continue
		}
		delete(want, p.ID)
		out = append(out, RecoveryPeer{ID: p.ID, Address: p.Address, NonVoter: p.Suffrage != SuffrageVoter})
	}
	if len(want) > 0 {
		var missing []string
		for _, id := range ids {
			if want[id] {
				missing = append(missing, id)
			}
		}
		return nil, fmt.Errorf("servers %s are not in the raft configuration of %s", strings.Join(missing, ","), st.RaftDir)
	}
	return out, nil
}

// ErrServerRunning is returned by ReadOfflineRaftState when the raft
// store is locked: a server is running on the data dir.
var ErrServerRunning = errors.New("the raft store is locked: a server is running on this data dir")

// ReadOfflineRaftState reads the last known raft configuration and the
// last index and term from the data dir of a stopped server (the
// server's data dir, holding raft/). It never writes to the raft store.
// It waits at most lockTimeout for the store's lock and returns
// ErrServerRunning when a running server holds it.
func ReadOfflineRaftState(dataDir string, lockTimeout time.Duration) (OfflineRaftState, error) {
	dir := RaftDir(dataDir)
	st := OfflineRaftState{RaftDir: dir}
	dbPath := filepath.Join(dir, raftDBName)
	// bbolt would create a missing file even read-only; an operator's
	// typo must not leave an empty store behind.
	if _, err := os.Stat(dbPath); err != nil {
		return st, fmt.Errorf("server: no raft store in %s: %w", dataDir, err)
	}
	store, err := raftboltdb.New(raftboltdb.Options{
		Path:        dbPath,
		BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: lockTimeout},
	})
	if errors.Is(err, bbolt.ErrTimeout) {
		return st, fmt.Errorf("server: open %s: %w", dbPath, ErrServerRunning)
	}
	if err != nil {
		return st, fmt.Errorf("server: open %s: %w", dbPath, err)
	}
	defer store.Close()

	if _, err := os.Stat(filepath.Join(dir, PeersFileName)); err == nil {
		st.PeersFilePending = true
	}
	// Only after the lock was had: the snapshot store checks that it can
	// write to its directory.
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, hclog.NewNullLogger())
	if err != nil {
		return st, fmt.Errorf("server: open snapshot store in %s: %w", dir, err)
	}
	metas, err := snaps.List()
	if err != nil {
		return st, fmt.Errorf("server: list snapshots in %s: %w", dir, err)
	}
	var conf raft.Configuration
	var snapIndex uint64
	if len(metas) > 0 {
		m := metas[0] // newest first
		conf, snapIndex = m.Configuration, m.Index
		st.ConfigurationIndex, st.ConfigurationSource = m.ConfigurationIndex, "snapshot "+m.ID
		st.LastIndex, st.LastTerm, st.SnapshotID = m.Index, m.Term, m.ID
	}

	first, err := store.FirstIndex()
	if err != nil {
		return st, fmt.Errorf("server: read %s: first index: %w", dbPath, err)
	}
	last, err := store.LastIndex()
	if err != nil {
		return st, fmt.Errorf("server: read %s: last index: %w", dbPath, err)
	}
	if last > 0 {
		var entry raft.Log
		if err := store.GetLog(last, &entry); err != nil {
			return st, fmt.Errorf("server: read %s: log %d: %w", dbPath, last, err)
		}
		if entry.Index >= st.LastIndex {
			st.LastIndex, st.LastTerm = entry.Index, entry.Term
		}
	}
	// The newest configuration entry after the snapshot wins; scan
	// backwards so a long log is read only as far as needed.
	for i := last; i >= max(first, snapIndex+1) && i > 0; i-- {
		var entry raft.Log
		if err := store.GetLog(i, &entry); err != nil {
			return st, fmt.Errorf("server: read %s: log %d: %w", dbPath, i, err)
		}
		if entry.Type != raft.LogConfiguration {
			continue
		}
		if conf, err = decodeConfiguration(entry.Data); err != nil {
			return st, fmt.Errorf("server: read %s: log %d: %w", dbPath, i, err)
		}
		st.ConfigurationIndex, st.ConfigurationSource = entry.Index, "log"
		break
	}
	if st.ConfigurationSource == "" {
		return st, fmt.Errorf("server: %s holds no raft configuration (the server never joined a cluster)", dir)
	}
	for _, srv := range conf.Servers {
		st.Servers = append(st.Servers, OfflinePeer{ID: string(srv.ID), Address: string(srv.Address), Suffrage: SuffrageName(srv.Suffrage)})
	}
	return st, nil
}

// decodeConfiguration decodes a configuration log entry; raft's decoder
// panics on bad data, which a tool reading a damaged store must survive.
func decodeConfiguration(data []byte) (conf raft.Configuration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bad configuration entry: %v", r)
		}
	}()
	return raft.DecodeConfiguration(data), nil
}
