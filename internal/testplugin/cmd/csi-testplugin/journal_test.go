package main

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testplugin/journal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// csiClient connects to socket for the test.
func csiClient(t *testing.T, socket string) (csi.ControllerClient, csi.NodeClient) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn), csi.NewNodeClient(conn)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var snwCap = &csi.VolumeCapability{
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
}

// TestJournalSurvivesSIGKILL kills the plugin process right after an
// answer and checks the journal holds the answered call's end record: it
// was synced before the answer was sent.
func TestJournalSurvivesSIGKILL(t *testing.T) {
	tests := []struct {
		name string
		// last makes the calls on a fresh plugin, the last one right
		// before the kill, and returns the end record it must leave.
		last func(t *testing.T, ctrl csi.ControllerClient, node csi.NodeClient, dir string) journal.Record
	}{
		{"stage", func(t *testing.T, ctrl csi.ControllerClient, node csi.NodeClient, dir string) journal.Record {
			id := create(t, ctrl)
			staging := filepath.Join(dir, "staging")
			if _, err := node.NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snwCap}); err != nil {
				t.Fatal(err)
			}
			return journal.Record{Method: "NodeStageVolume", VolumeID: id, StagingPath: staging}
		}},
		{"publish", func(t *testing.T, ctrl csi.ControllerClient, node csi.NodeClient, dir string) journal.Record {
			id := create(t, ctrl)
			staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
			if _, err := node.NodeStageVolume(callCtx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snwCap}); err != nil {
				t.Fatal(err)
			}
			if _, err := node.NodePublishVolume(callCtx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: snwCap}); err != nil {
				t.Fatal(err)
			}
			return journal.Record{Method: "NodePublishVolume", VolumeID: id, StagingPath: staging, TargetPath: target}
		}},
		{"controller publish", func(t *testing.T, ctrl csi.ControllerClient, _ csi.NodeClient, _ string) journal.Record {
			id := create(t, ctrl)
			if _, err := ctrl.ControllerPublishVolume(callCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: snwCap}); err != nil {
				t.Fatal(err)
			}
			return journal.Record{Method: "ControllerPublishVolume", VolumeID: id, NodeID: "n1"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := shortDir(t)
			sock, path := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "calls.jsonl")
			cmd := start(t, "--socket", sock, "--node-id", "n1", "--state-dir", filepath.Join(dir, "state"), "--journal", path)
			ctrl, node := csiClient(t, sock)
			want := tt.last(t, ctrl, node, dir)
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			exitCode(t, cmd)

			recs, err := journal.Read(path)
			if err != nil && !errors.Is(err, journal.ErrTornLine) {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				t.Fatal("the journal holds no record")
			}
			last := recs[len(recs)-1]
			if last.Phase != "end" || last.Code != "OK" || last.Method != want.Method || last.VolumeID != want.VolumeID ||
				last.StagingPath != want.StagingPath || last.TargetPath != want.TargetPath || last.NodeID != want.NodeID || last.Node != "n1" {
				t.Fatalf("last record %+v, want the end of %+v", last, want)
			}
			if want.Method != "ControllerPublishVolume" {
				// The killed plugin left the volume on n1, and no claim
				// holds it: the reader's check sees it.
				left := journal.Leftovers(recs, func(string, string) bool { return false })
				if len(left) != 1 || left[0].VolumeID != want.VolumeID || !slices.Equal(left[0].Nodes, []string{"n1"}) {
					t.Fatalf("Leftovers = %v, want volume %s on n1", left, want.VolumeID)
				}
			}
		})
	}
}

func create(t *testing.T, ctrl csi.ControllerClient) string {
	t.Helper()
	resp, err := ctrl.CreateVolume(callCtx(t), &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{snwCap}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId()
}

// TestJournalRestartedProcessAppends checks a plugin process started
// again on the same journal after a SIGKILL adds its records, as a new
// instance, to those of the killed one; and that plugins of --dir share
// one journal.
func TestJournalRestartedProcessAppends(t *testing.T) {
	dir := shortDir(t)
	path, state := filepath.Join(dir, "calls.jsonl"), filepath.Join(dir, "state")
	var instances, plugins []string
	for round := range 2 {
		cmd := start(t, "--dir", dir, "--count", "2", "--node-id", "n1", "--state-dir", state, "--journal", path)
		for i := range 2 {
			_, node := csiClient(t, filepath.Join(dir, []string{"p0000", "p0001"}[i], "csi.sock"))
			if _, err := node.NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{}); err != nil {
				t.Fatalf("round %d plugin %d: %v", round, i, err)
			}
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		exitCode(t, cmd)
	}
	recs, err := journal.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !slices.Contains(instances, r.Instance) {
			instances = append(instances, r.Instance)
		}
		if !slices.Contains(plugins, r.Plugin) {
			plugins = append(plugins, r.Plugin)
		}
	}
	slices.Sort(plugins)
	if len(recs) != 8 || len(instances) != 4 || !slices.Equal(plugins, []string{"p0000.csi.testplugin.csisupd", "p0001.csi.testplugin.csisupd"}) {
		t.Fatalf("%d records of instances %v and plugins %v, want 8 of 4 instances and 2 plugins", len(recs), instances, plugins)
	}
}
