//go:build fault

package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Under a systemd watchdog of 400 ms, a healthy dev-like agent (server and
// client, Consul registration, real plugins) starting and then doing
// normal work for 30 s never lets the gap between two WATCHDOG=1 messages
// come near the timeout, at which systemd kills it: every gap, from
// READY=1 to the end, stays under 0.7 of the timeout. The work: volumes
// created, claimed, released and deleted through the servers, a plugin
// added, a plugin stopped and started again, a reload.
func TestWatchdogGapsStayFarBelowTimeout(t *testing.T) {
	const (
		watchdogUsec = 400000
		timeout      = watchdogUsec * time.Microsecond
		maxGap       = timeout * 7 / 10
		work         = 30 * time.Second
	)
	sock := newNotifySocket(t)
	t.Setenv("WATCHDOG_USEC", fmt.Sprint(watchdogUsec))
	t.Setenv("WATCHDOG_PID", "")

	cfg, _ := devConsulConfig(t, "wd-node")
	cfg.Consul.SyncInterval = 2 * time.Second
	cfg.Client.ProbeInterval, cfg.Client.ProbeTimeout = time.Second, time.Second
	cfg.Client.DeregisterGrace = time.Second
	cfg.LogLevel = "debug" // as dev mode logs

	p1 := startPlugin(t, cfg, "p1")
	startPlugin(t, cfg, "p2")
	logs := &testutil.SyncBuffer{}
	a, err := New(Config{Config: cfg, Version: "test", Logger: hclog.New(&hclog.LoggerOptions{Output: logs})})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	waitHealthy(t, a, "p1")

	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	control := csisupdv1.NewControlClient(conn)
	end := time.Now().Add(work)
	for i := 0; time.Now().Before(end); i++ {
		volumeRound(t, control, a.NodeID(), fmt.Sprintf("wd-vol-%d", i))
		switch i {
		case 3:
			startPlugin(t, cfg, "p3")
		case 6:
			p1.Stop()
		case 9:
			p1 = startPlugin(t, cfg, "p1")
		case 12:
			if err := a.Reload(cfg); err != nil {
				t.Errorf("Reload: %v", err)
			}
		}
	}
	stopped := time.Now()
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}

	// systemd starts the watchdog at READY=1 and kills the service when
	// no WATCHDOG=1 follows within the timeout.
	var marks []time.Time
	ready := false
	for _, m := range sock.record() {
		switch {
		case m.at.After(stopped):
		case strings.HasPrefix(m.text, "READY=1"):
			ready = true
			marks = append(marks, m.at)
		case ready && m.text == "WATCHDOG=1":
			marks = append(marks, m.at)
		}
	}
	if !ready {
		t.Fatal("no READY=1")
	}
	marks = append(marks, stopped)
	var longest time.Duration
	var at time.Time
	for i := 1; i < len(marks); i++ {
		if gap := marks[i].Sub(marks[i-1]); gap > longest {
			longest, at = gap, marks[i-1]
		}
	}
	t.Logf("%d pings in %s after READY=1; longest gap %s (%.0f%% of the %s timeout) after %s",
		len(marks)-2, stopped.Sub(marks[0]).Round(time.Millisecond), longest, 100*float64(longest)/float64(timeout),
		timeout, at.Sub(marks[0]).Round(time.Millisecond))
	if longest >= maxGap {
		t.Errorf("longest gap between watchdog pings %s, want under %s (0.7 of WATCHDOG_USEC)", longest, maxGap)
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "watchdog") {
				t.Log(line)
			}
		}
	}
}

// volumeRound creates volume id on p2, claims it for a workload on node,
// releases and deletes it.
func volumeRound(t *testing.T, control csisupdv1.ControlClient, node, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := control.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{
		Id: id, PluginId: "p2",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
	}); err != nil {
		t.Fatalf("CreateVolume %s: %v", id, err)
	}
	if _, err := control.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: id, NodeId: node, WorkloadId: "w-" + id}); err != nil {
		t.Fatalf("ClaimVolume %s: %v", id, err)
	}
	if _, err := control.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: id, NodeId: node, WorkloadId: "w-" + id}); err != nil {
		t.Fatalf("ReleaseVolume %s: %v", id, err)
	}
	if _, err := control.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: id}); err != nil {
		t.Fatalf("DeleteVolume %s: %v", id, err)
	}
}

// record returns every message read so far, in order.
func (s *notifySocket) record() []notifyMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}
