package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
)

// Small event buffers, so that a test falls behind and out of the buffer
// in a few writes.
const (
	testEventBufferSize = 16
	testEventMaxLag     = 4
)

// eventCluster starts one server with small event buffers and no node
// heartbeat deadline within a test's time, so that every event comes from
// the test's own writes.
func eventCluster(t *testing.T) *testcluster.Cluster {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.EventBufferSize, cfg.EventMaxLag = testEventBufferSize, testEventMaxLag
		cfg.MinHeartbeatTTL, cfg.HeartbeatGrace, cfg.FailoverHeartbeatTTL = time.Hour, time.Hour, time.Hour
	}})
	checkFormed(t, c, 1)
	return c
}

// registerVolume registers a volume and returns the raft index of the write.
func registerVolume(t testing.TB, cl csisupdv1.ControlClient, id string) uint64 {
	t.Helper()
	resp, err := cl.RegisterVolume(context.Background(), &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: id, PluginId: "p", ExternalId: "x-" + id}})
	if err != nil {
		t.Fatalf("register volume %s: %v", id, err)
	}
	return resp.GetVolume().GetModifyIndex()
}

// eventLine renders an event for comparisons.
func eventLine(e *csisupdv1.ClusterEvent) string {
	return fmt.Sprintf("%d %s node=%s plugin=%s volume=%s", e.GetIndex(), e.GetType(), e.GetNodeId(), e.GetPluginId(), e.GetVolumeId())
}

// recvUntil receives events until one with index last, and fails t on an
// error or an event past last.
func recvUntil(t testing.TB, s grpc.ServerStreamingClient[csisupdv1.ClusterEvent], last uint64) []string {
	t.Helper()
	var out []string
	for {
		e, err := s.Recv()
		if err != nil {
			t.Fatalf("receive up to index %d, after %d events: %v", last, len(out), err)
		}
		if e.GetIndex() > last {
			t.Fatalf("event past index %d: %s", last, eventLine(e))
		}
		out = append(out, eventLine(e))
		if e.GetIndex() == last {
			// The rest of the batch at last, if any, would be lost here:
			// callers end with a one-event batch.
			return out
		}
	}
}

// TestWatchEventsFellBehindResumesWithoutGap has a subscriber stop reading
// in the middle of a large batch while more than EventMaxLag batches are
// applied: the server ends its stream with EventsFellBehind, and a stream
// resumed from the index it names continues without a gap or a duplicate.
func TestWatchEventsFellBehindResumesWithoutGap(t *testing.T) {
	c := eventCluster(t)
	cl := c.Control(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := registerVolume(t, cl, "v0")
	// The slow reader's connection has the smallest flow control windows
	// (which also turns off their growth), so that the server's Send
	// blocks once the reader leaves some 128 KiB unread.
	conn, err := grpc.NewClient(c.Member(0).RPCAddr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	slow, err := csisupdv1.NewControlClient(conn).WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Its first event shows that it follows the newest events.
	got := recvUntil(t, slow, first)

	// A node with many plugins, then the same node with none: one batch
	// of about 1 MiB of plugin-gc events, which the slow reader stops
	// reading in the middle of.
	plugins := make([]*csisupdv1.Plugin, 1000)
	for i := range plugins {
		plugins[i] = &csisupdv1.Plugin{Id: fmt.Sprintf("p%04d-%s", i, strings.Repeat("x", 1000)), Type: "node", Healthy: true}
	}
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	if _, err := cluster.NodeRegister(asNode(ctx, "n1"), &csisupdv1.NodeRegisterRequest{NodeId: "n1", Name: "n1", Address: "127.0.0.1:1", Plugins: plugins}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.NodeUpdatePlugins(asNode(ctx, "n1"), &csisupdv1.NodeUpdatePluginsRequest{NodeId: "n1"}); err != nil {
		t.Fatal(err)
	}
	// More than EventMaxLag batches after it, while the reader is stalled.
	var last uint64
	for i := range testEventMaxLag + 1 {
		last = registerVolume(t, cl, fmt.Sprintf("s%d", i))
	}

	// The slow reader reads again: what the server had sent, then the end.
	var endErr error
	for {
		e, err := slow.Recv()
		if err != nil {
			endErr = err
			break
		}
		got = append(got, eventLine(e))
	}
	if status.Code(endErr) != codes.ResourceExhausted {
		t.Fatalf("slow stream ended with %v, want ResourceExhausted", endErr)
	}
	behind, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsFellBehind](endErr)
	if !ok {
		t.Fatalf("slow stream ended with %v, without the EventsFellBehind detail", endErr)
	}
	if behind.GetMaxLag() != testEventMaxLag || behind.GetLag() <= testEventMaxLag {
		t.Fatalf("fell behind %d batches with a limit of %d, want more than %d", behind.GetLag(), behind.GetMaxLag(), testEventMaxLag)
	}
	resume := behind.GetResumeIndex()
	if lastGot := got[len(got)-1]; !strings.HasPrefix(lastGot, fmt.Sprintf("%d ", resume)) {
		t.Fatalf("resume index %d is not the index of the last event received: %s", resume, lastGot)
	}
	if msg := status.Convert(endErr).Message(); !strings.Contains(msg, fmt.Sprintf("resume from index %d", resume)) {
		t.Fatalf("message %q does not name the resume index %d", msg, resume)
	}
	if resume >= last {
		t.Fatalf("resume index %d, want it before the last write at %d", resume, last)
	}

	// Resumed from that index, the stream continues where it ended.
	resumed, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: resume})
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, recvUntil(t, resumed, last)...)

	// A reference stream replays the whole buffer, which still holds
	// every batch: the slow reader's events with the resumed ones are
	// exactly those, in order.
	ref, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := recvUntil(t, ref, last)
	if len(want) != 1+1+1001+testEventMaxLag+1 {
		t.Fatalf("reference stream has %d events, want %d", len(want), 1+1+1001+testEventMaxLag+1)
	}
	if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
		t.Fatalf("slow and resumed streams differ from the reference (%d events, want %d)", len(got), len(want))
	}

	// Once the buffer dropped the batches after an index, a stream after
	// it is told they are gone, not given a gap. A buffer's worth of
	// writes leaves only them buffered.
	var oldest uint64
	for i := range testEventBufferSize {
		if index := registerVolume(t, cl, fmt.Sprintf("g%d", i)); i == 0 {
			oldest = index
		}
	}
	gone, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: first})
	if err != nil {
		t.Fatal(err)
	}
	_, err = gone.Recv()
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("stream after a dropped index ended with %v, want OutOfRange", err)
	}
	g, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsGone](err)
	if !ok || g.GetAfter() != first || g.GetOldestIndex() != oldest {
		t.Fatalf("EventsGone detail %v, want after %d, oldest %d", g, first, oldest)
	}
	// Without an index, the stream replays what is buffered.
	all, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := all.Recv()
	if err != nil || e.GetIndex() != g.GetOldestIndex() {
		t.Fatalf("first buffered event %v, %v; want one at the oldest index %d", e, err, g.GetOldestIndex())
	}
}

// TestWatchEventsEndAtSnapshotRestore checks that a restore, which
// replaces the state without events, ends the streams that predate it as
// gone, and that a reader that reads the state again can follow from the
// index it was given.
func TestWatchEventsEndAtSnapshotRestore(t *testing.T) {
	c := eventCluster(t)
	cl := c.Control(0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := registerVolume(t, cl, "v1")
	snap := saveSnapshot(t, cl)
	second := registerVolume(t, cl, "v2")
	open, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recvUntil(t, open, second); len(got) != 2 {
		t.Fatalf("events before the restore: %v, want v1 and v2", got)
	}

	restoreSnapshot(t, cl, snap)

	// The open stream ends: the events it had do not lead to the state.
	_, err = open.Recv()
	g, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsGone](err)
	if status.Code(err) != codes.OutOfRange || !ok || g.GetAfter() != second {
		t.Fatalf("open stream at the restore ended with %v (detail %v), want OutOfRange with EventsGone after %d", err, g, second)
	}
	// The state is read again; its index is past every index handed out
	// before, although the snapshot is older.
	list, err := cl.ListVolumes(ctx, &csisupdv1.VolumeListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetVolumes()) != 1 || list.GetIndex() <= second {
		t.Fatalf("state after the restore: %d volumes at index %d, want v1 alone at an index after %d", len(list.GetVolumes()), list.GetIndex(), second)
	}
	if g.GetOldestIndex() != list.GetIndex() {
		t.Fatalf("EventsGone names the oldest index %d, want the restore's %d", g.GetOldestIndex(), list.GetIndex())
	}
	// A stream after an index before the restore is gone too.
	for _, from := range []uint64{first, second} {
		s, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: from})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); status.Code(err) != codes.OutOfRange {
			t.Fatalf("stream after index %d, before the restore: %v, want OutOfRange", from, err)
		}
	}
	// From the state's index it follows the writes after the restore.
	follow, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: list.GetIndex()})
	if err != nil {
		t.Fatal(err)
	}
	third := registerVolume(t, cl, "v3")
	got := recvUntil(t, follow, third)
	if want := fmt.Sprintf("%d volume-created node= plugin=p volume=v3", third); len(got) != 1 || got[0] != want {
		t.Fatalf("events after the restore: %v, want [%s]", got, want)
	}
}
