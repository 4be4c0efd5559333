package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestVolumeSpecFile creates a volume from a Nomad-style specification
// (topology, capability, mount options, parameters, secrets) with the
// CLI: the volume lands where its topology asks, records what the spec
// says, and its secret reaches the plugin but none of the servers' raft
// data, any log line at trace level, or any cluster event.
func TestVolumeSpecFile(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs})})
	var plugins []*testplugin.Plugin
	for i, a := range c.Agents() {
		plugins = append(plugins, a.StartPlugin("nl", testplugin.Config{
			NodeID: fmt.Sprintf("csi-node-%d", i), NodeLocal: true, TopologyKey: "node",
		}))
	}
	addr := followerAddr(t, c)
	testutil.WaitFor(t, 30*time.Second, "plugin nl healthy on both agents", func() bool {
		p, ok := tryPlugin(t, addr, "nl")
		return ok && p.ControllersHealthy == 2 && p.NodesHealthy == 2
	})

	marker := secret(t, "spec-token")
	spec := filepath.Join(t.TempDir(), "volume.hcl")
	if err := os.WriteFile(spec, []byte(`
id           = "spec-vol"
name         = "spec-vol"
type         = "csi"
plugin_id    = "nl"
capacity_min = "2MiB"
capacity_max = "8MiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}

topology_request {
  required {
    topology {
      segments {
        node = "csi-node-1"
      }
    }
  }
}

parameters {
  tier = "fast"
}

secrets {
  token = "`+marker+`"
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "-f", spec)
	if vol.ID != "spec-vol" || vol.ControllerNodeID != c.Agent(1).NodeID() || vol.Parameters["tier"] != "fast" || vol.CapacityBytes < 2<<20 {
		t.Fatalf("volume created from the spec: %+v", vol)
	}
	var full struct {
		Capabilities []struct {
			AccessMode string   `json:"access_mode"`
			FsType     string   `json:"fs_type"`
			MountFlags []string `json:"mount_flags"`
		} `json:"capabilities"`
		CapacityLimitBytes int64 `json:"capacity_limit_bytes,string"`
	}
	cliJSON(t, addr, &full, "volume", "status", "spec-vol")
	if len(full.Capabilities) != 1 || full.Capabilities[0].AccessMode != "SINGLE_NODE_WRITER" || full.Capabilities[0].FsType != "ext4" ||
		strings.Join(full.Capabilities[0].MountFlags, ",") != "noatime" || full.CapacityLimitBytes != 8<<20 {
		t.Errorf("volume status of spec-vol: %+v", full)
	}
	got := plugins[1].Secrets("CreateVolume")
	if len(got) == 0 || got[len(got)-1]["token"] != marker {
		t.Errorf("the plugin's CreateVolume secrets = %v, want the spec's token", got)
	}

	// The cluster's events, up to now.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.Control(c.WaitForLeader(t, 10*time.Second).Index).WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		e, err := stream.Recv()
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if strings.Contains(e.String(), marker) {
			t.Fatalf("cluster event %v holds the secret", e)
		}
		if e.GetType() == "volume-created" && e.GetVolumeId() == "spec-vol" {
			break
		}
	}
	if strings.Contains(logs.String(), marker) {
		t.Error("a log line holds the secret")
	}
	for _, m := range c.Members() {
		err := filepath.WalkDir(m.DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte(marker)) {
				t.Errorf("server data file %s holds the secret", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
