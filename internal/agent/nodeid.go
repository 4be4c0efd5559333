package agent

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("agent: node id: %w", err)
	}
	return id, nil
}
