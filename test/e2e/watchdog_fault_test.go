//go:build fault

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Under a systemd watchdog of 400 ms (a real notify socket, as systemd
// sets it up), `csisupd agent --dev` registering in Consul, with its demo
// plugin and a second plugin, starting and then doing normal work for
// 30 s never lets the gap between two WATCHDOG=1 messages come near the
// timeout, at which systemd kills it: every gap, from READY=1 to the end,
// stays under 0.7 of the timeout. The work: 20 volumes a second created,
// claimed, released and deleted through the servers, the second plugin
// stopped and started again, and a reload (SIGHUP).
func TestWatchdogGapsStayFarBelowTimeout(t *testing.T) {
	const (
		watchdogUsec = 400000
		timeout      = watchdogUsec * time.Microsecond
		maxGap       = timeout * 7 / 10
		work         = 30 * time.Second
		roundEvery   = 50 * time.Millisecond
	)
	sock := testutil.NewNotifySocket(t)
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(watchdogUsec))
	t.Setenv("WATCHDOG_PID", "")

	consul, err := consultest.New(consultest.Config{NodeName: "wd0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)
	dataDir := testutil.TempDir(t)
	extra := filepath.Join(testutil.TempDir(t), "extra.hcl")
	if err := os.WriteFile(extra, []byte(fmt.Sprintf(`consul {
  enabled       = true
  address       = %q
  sync_interval = "2s"
}
client {
  probe_interval   = "1s"
  probe_timeout    = "1s"
  deregister_grace = "1s"
}
`, consul.Addr())), 0o600); err != nil {
		t.Fatal(err)
	}
	ports := testutil.FreePorts(t, 3)
	agent := startAgentProcess(t, "dev agent", ports[2], "--dev", "--name", "wd0", "--data-dir", dataDir,
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]),
		"--config", extra)
	nodeID, err := os.ReadFile(filepath.Join(dataDir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	node := strings.TrimSpace(string(nodeID))

	second := testplugin.Config{
		Socket: filepath.Join(dataDir, "plugins", "p2", "csi.sock"), StateDir: testutil.TempDir(t),
		Type: testplugin.TypeMonolith, NodeID: "wd0",
	}
	if err := os.MkdirAll(filepath.Dir(second.Socket), 0o755); err != nil {
		t.Fatal(err)
	}
	p2 := startTestPlugin(t, second)

	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", ports[0]), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	control := csisupdv1.NewControlClient(conn)
	// Normal work: a volume round (four API calls, each a raft write and
	// plugin calls) every roundEvery, a steady load well above what an
	// agent usually sees, without saturating the machine's cores with the
	// test's own requests.
	pace := time.NewTicker(roundEvery)
	defer pace.Stop()
	end := time.Now().Add(work)
	rounds := 0
	for i := 0; time.Now().Before(end); i++ {
		<-pace.C
		rounds++
		volumeRound(t, control, node, fmt.Sprintf("wd-vol-%d", i))
		switch i {
		case 5:
			p2.Stop()
		case 10:
			p2 = startTestPlugin(t, second)
		case 15:
			if err := agent.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
	}
	stopped := time.Now()
	if err := agent.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}

	// systemd starts the watchdog at READY=1 and kills the service when
	// no WATCHDOG=1 follows within the timeout.
	var marks []time.Time
	ready := false
	for _, m := range sock.Record() {
		switch {
		case m.At.After(stopped):
		case m.Text == "READY=1" || strings.HasPrefix(m.Text, "READY=1\n"):
			if !ready { // a reload's READY=1 is no start
				marks = append(marks, m.At)
			}
			ready = true
		case ready && m.Text == "WATCHDOG=1":
			marks = append(marks, m.At)
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
	t.Logf("%d volume rounds; %d pings in %s after READY=1; longest gap %s (%.0f%% of the %s timeout), %s after READY=1",
		rounds, len(marks)-2, stopped.Sub(marks[0]).Round(time.Millisecond), longest.Round(100*time.Microsecond),
		100*float64(longest)/float64(timeout), timeout, at.Sub(marks[0]).Round(time.Millisecond))
	if longest >= maxGap {
		t.Errorf("longest gap between watchdog pings %s, want under %s (0.7 of WATCHDOG_USEC)", longest, maxGap)
	}
}

// volumeRound creates volume id on the demo plugin, claims it for a
// workload on node, releases and deletes it.
func volumeRound(t *testing.T, control csisupdv1.ControlClient, node, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := control.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{
		Id: id, PluginId: "demo",
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
