package agent

import (
	"path/filepath"
	"time"

	"github.com/csisupd/csisupd/internal/server/raftnode"
)

// serverDir is the server role's directory inside the agent's data_dir.
const serverDir = "server"

// OfflineRaftState is the raft state read from a stopped server's data
// dir; see raftnode.OfflineRaftState.
type OfflineRaftState = raftnode.OfflineRaftState

// RecoveryPeer is one server of a peers.json file.
type RecoveryPeer = raftnode.RecoveryPeer

// ErrServerRunning means a server is running on the data dir that was to
// be read offline.
var ErrServerRunning = raftnode.ErrServerRunning

// ReadOfflineRaftState reads the last known raft configuration of the
// stopped server whose agent data_dir is dataDir, waiting at most
// lockTimeout for the raft store's lock.
func ReadOfflineRaftState(dataDir string, lockTimeout time.Duration) (OfflineRaftState, error) {
	return raftnode.ReadOfflineRaftState(ServerDataDir(dataDir), lockTimeout)
}

// ServerDataDir is the server role's data dir inside the agent's data_dir.
func ServerDataDir(dataDir string) string { return filepath.Join(dataDir, serverDir) }

// PeersFilePath is where the server of the agent data_dir dataDir reads a
// peers.json at start.
func PeersFilePath(dataDir string) string {
	return filepath.Join(raftnode.RaftDir(ServerDataDir(dataDir)), raftnode.PeersFileName)
}
