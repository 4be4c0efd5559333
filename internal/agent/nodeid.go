package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/safefile"
)

// nodeIDFile holds the node's stable id inside data_dir.
const nodeIDFile = "node-id"

// loadNodeID returns the node id saved in dataDir, creating a random one on
// first start. The id names the node to the servers and the server to raft,
// so it must survive restarts and never follow the host name.
func loadNodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, nodeIDFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(data))
		if id == "" {
			return "", fmt.Errorf("agent: %s is empty; remove it to get a new node id", path)
		}
		return id, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("agent: node id: %w", err)
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("agent: node id: %w", err)
	}
	id := ids.NodeID(b)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("agent: node id: %w", err)
	}
	return id, nil
}

// nodeSecretFile holds the node's secret inside data_dir, mode 0600.
const nodeSecretFile = "node-secret"

// loadNodeSecret returns the node secret saved in dataDir, creating a
// random one on first start. The agent presents it on every call of the
// Cluster service; the servers keep only its hash and refuse a call for
// this node with another secret, so that no other node can act as this
// one. A reinstalled agent (an empty data_dir) makes a new one, which the
// servers refuse until an operator runs `csisupd node rekey`.
func loadNodeSecret(dataDir string) (string, error) {
	path := filepath.Join(dataDir, nodeSecretFile)
	// Read as a secrets file is: regular, private to the agent's user, in
	// directories nobody else can change.
	data, err := safefile.Read(context.Background(), path, safefile.Spec{What: "agent: node secret", MaxSize: 4 << 10, Private: true})
	switch {
	case err == nil:
		secret := strings.TrimSpace(string(data))
		if len(secret) < 32 {
			return "", fmt.Errorf("agent: node secret %s is empty or too short; remove it only if this node is to register as new (then `csisupd node rekey` it)", path)
		}
		return secret, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("agent: node secret: %w", err)
	}
	secret := fmt.Sprintf("%x", b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("agent: node secret: %w", err)
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("agent: node secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", fmt.Errorf("agent: node secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("agent: node secret: %w", err)
	}
	return secret, nil
}
