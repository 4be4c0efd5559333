package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestVolumeHealthMonitor reports a volume abnormal in its plugin: the
// leader's monitor records it within an interval, with a volume-abnormal
// event; a steady state writes nothing to raft while the monitor keeps
// asking; back to normal gives volume-normal.
func TestVolumeHealthMonitor(t *testing.T) {
	var regs registries
	cc := newClaimClusterWith(t, func(cfg *server.Config) {
		cfg.VolumeHealthInterval = 100 * time.Millisecond
		regs.configure(cfg)
	},
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH)
	v := cc.create(t, "v", "SINGLE_NODE_WRITER")
	askedEach := func() []int64 {
		var n []int64
		for _, p := range cc.plugins {
			n = append(n, p.Stats().Calls["ControllerListVolumeHealth"])
		}
		return n
	}
	asked := func() int64 {
		var n int64
		for _, c := range askedEach() {
			n += c
		}
		return n
	}
	// setCondition changes what every plugin reports of v, then waits
	// until one whole monitor round has asked every controller after the
	// change and has ended. A round asks each controller once, one after
	// the other, and writes what changed before the next round begins; so
	// once every controller has been asked twice since the change, some
	// round asked them all after it, and the next one has begun. "Within
	// one interval" is thus counted in rounds, not in time.
	setCondition := func(abnormal bool, message string) {
		t.Helper()
		for _, p := range cc.plugins {
			p.SetVolumeCondition(v.GetExternalId(), abnormal, message)
		}
		from := askedEach()
		testutil.WaitFor(t, 20*time.Second, "one whole health round after the change", func() bool {
			for i, n := range askedEach() {
				if n < from[i]+2 {
					return false
				}
			}
			return true
		})
	}

	setCondition(true, "disk slow")
	got := cc.volume(t, "v").GetConditions()
	if len(got) != 1 || got[0].GetSource() != "controller" || !strings.Contains(got[0].GetMessage(), "DEGRADED") {
		t.Fatalf("conditions one round after the change = %v, want the controller's DEGRADED", got)
	}
	abnormalGauge := func() float64 {
		v, _ := testutil.MetricValue(t, regs.of(cc.c.WaitForLeader(t, 30*time.Second).ID), "csisupd_cluster_volumes_abnormal")
		return v
	}
	if g := abnormalGauge(); g != 1 {
		t.Errorf("csisupd_cluster_volumes_abnormal = %v with one abnormal volume, want 1", g)
	}
	events := volumeEvents(t, cc.control(t), "v", typeIs("volume-abnormal"))
	if e := events[len(events)-1]; !strings.Contains(e.GetDescription(), "disk slow") || e.GetNodeId() != "" {
		t.Errorf("event %v, want the controller's message", e)
	}

	// Steady state: the monitor asks again and again, and writes nothing.
	index := func() uint64 {
		resp, err := cc.control(t).ListVolumes(context.Background(), &csisupdv1.VolumeListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetIndex()
	}
	before, askedBefore := index(), asked()
	testutil.WaitFor(t, 20*time.Second, "ten more health listings", func() bool { return asked() >= askedBefore+10 })
	if after := index(); after != before {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		st, _ := cc.control(t).WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: before})
		for {
			e, err := st.Recv()
			if err != nil {
				break
			}
			t.Logf("written in the steady state: %v", e)
		}
		t.Errorf("raft index went from %d to %d in a steady state", before, after)
	}

	setCondition(false, "")
	if got := cc.volume(t, "v").GetConditions(); len(got) != 0 {
		t.Errorf("conditions one round after back to normal = %v", got)
	}
	if g := abnormalGauge(); g != 0 {
		t.Errorf("csisupd_cluster_volumes_abnormal = %v back to normal, want 0", g)
	}
	volumeEvents(t, cc.control(t), "v", typeIs("volume-normal"))
}

// TestGetVolumeHealth asks a claimed volume's health: the controller that
// holds it and the node that mounts it both answer, abnormal once its
// plugin says so.
func TestGetVolumeHealth(t *testing.T) {
	nc := newNodeLocalCluster(t, func(_ int, cfg *testplugin.Config) { cfg.VolumeHealth = true })
	v, err := nc.createOn(t, "v", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.claim(t, "v", 0, "w1", nil); err != nil {
		t.Fatal(err)
	}
	ask := func() []*csisupdv1.VolumeHealthAnswer {
		t.Helper()
		resp, err := nc.control(t).GetVolumeHealth(context.Background(), &csisupdv1.VolumeHealthGetRequest{Id: "v"})
		if err != nil {
			t.Fatal(err)
		}
		if a := resp.GetAnswers(); len(a) != 2 || a[0].GetSource() != "controller" || a[1].GetSource() != nc.c.Agent(0).NodeID() {
			t.Fatalf("answers = %v, want the controller's and node 0's", a)
		}
		return resp.GetAnswers()
	}
	for _, a := range ask() {
		if a.GetAbnormal() || a.GetError() != "" {
			t.Errorf("answer %v, want healthy", a)
		}
	}
	nc.plugins[0].SetVolumeCondition(v.GetExternalId(), true, "bad sectors")
	for _, a := range ask() {
		if !a.GetAbnormal() || !strings.Contains(a.GetMessage(), "bad sectors") {
			t.Errorf("answer %v, want abnormal with the plugin's message", a)
		}
	}
	if got := ask()[0].GetNodeId(); got != nc.c.Agent(0).NodeID() {
		t.Errorf("controller answer from node %s, want the holder's", got)
	}
}
