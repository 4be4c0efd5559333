package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// fakeControl answers the Control calls of the volume commands from
// fixed data and keeps the requests it got, so that the commands are
// tested from the flags to the printed output before a server implements
// the calls. It answers as the proto's comments say the servers do:
// pages by next_token, NotFound for an unknown snapshot.
type fakeControl struct {
	csisupdv1.UnimplementedControlServer

	mu       sync.Mutex
	requests []proto.Message
	snaps    []*csisupdv1.VolumeSnapshot
	volume   *csisupdv1.Volume
}

func (f *fakeControl) record(m proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, m)
}

// last returns the last request the server got.
func (f *fakeControl) last() proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) == 0 {
		return nil
	}
	return f.requests[len(f.requests)-1]
}

func (f *fakeControl) CreateVolume(_ context.Context, req *csisupdv1.VolumeCreateRequest) (*csisupdv1.VolumeCreateResponse, error) {
	f.record(req)
	return &csisupdv1.VolumeCreateResponse{Volume: &csisupdv1.Volume{Id: req.GetId(), PluginId: req.GetPluginId(), ExternalId: "ext-" + req.GetId()}}, nil
}

func (f *fakeControl) ExpandVolume(_ context.Context, req *csisupdv1.VolumeExpandRequest) (*csisupdv1.VolumeExpandResponse, error) {
	f.record(req)
	return &csisupdv1.VolumeExpandResponse{Volume: f.volume}, nil
}

func (f *fakeControl) ModifyVolume(_ context.Context, req *csisupdv1.VolumeModifyRequest) (*csisupdv1.VolumeModifyResponse, error) {
	f.record(req)
	v := proto.Clone(f.volume).(*csisupdv1.Volume)
	v.MutableParameters = req.GetMutableParameters()
	return &csisupdv1.VolumeModifyResponse{Volume: v}, nil
}

func (f *fakeControl) GetVolume(_ context.Context, req *csisupdv1.VolumeGetRequest) (*csisupdv1.VolumeGetResponse, error) {
	f.record(req)
	return &csisupdv1.VolumeGetResponse{Volume: f.volume, Index: 9}, nil
}

func (f *fakeControl) CreateVolumeSnapshot(_ context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*csisupdv1.VolumeSnapshotCreateResponse, error) {
	f.record(req)
	return &csisupdv1.VolumeSnapshotCreateResponse{Snapshot: f.snaps[0]}, nil
}

// ListVolumeSnapshots hands out one snapshot per page when page_size is
// 1, each page's token the index of the next snapshot.
func (f *fakeControl) ListVolumeSnapshots(_ context.Context, req *csisupdv1.VolumeSnapshotListRequest) (*csisupdv1.VolumeSnapshotListResponse, error) {
	f.record(req)
	var match []*csisupdv1.VolumeSnapshot
	for _, s := range f.snaps {
		if (req.GetVolumeId() == "" || s.GetSourceVolumeId() == req.GetVolumeId()) && (req.GetPluginId() == "" || s.GetPluginId() == req.GetPluginId()) {
			match = append(match, s)
		}
	}
	if req.GetPageSize() != 1 {
		return &csisupdv1.VolumeSnapshotListResponse{Snapshots: match, Index: 7}, nil
	}
	start := 0
	if req.GetNextToken() != "" {
		for start < len(match) && match[start].GetId() != req.GetNextToken() {
			start++
		}
	}
	resp := &csisupdv1.VolumeSnapshotListResponse{Index: 7}
	if start < len(match) {
		resp.Snapshots = match[start : start+1]
	}
	if start+1 < len(match) {
		resp.NextToken = proto.String(match[start+1].GetId())
	}
	return resp, nil
}

func (f *fakeControl) GetVolumeSnapshot(_ context.Context, req *csisupdv1.VolumeSnapshotGetRequest) (*csisupdv1.VolumeSnapshotGetResponse, error) {
	f.record(req)
	for _, s := range f.snaps {
		if s.GetId() == req.GetId() {
			return &csisupdv1.VolumeSnapshotGetResponse{Snapshot: s, Index: 7}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "snapshot %q not found", req.GetId())
}

func (f *fakeControl) DeleteVolumeSnapshot(_ context.Context, req *csisupdv1.VolumeSnapshotDeleteRequest) (*csisupdv1.VolumeSnapshotDeleteResponse, error) {
	f.record(req)
	return &csisupdv1.VolumeSnapshotDeleteResponse{}, nil
}

var snapTime = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// startFakeControl serves a fakeControl with two snapshots and a volume
// whose expansion waits for a node, and returns it with its address.
func startFakeControl(t *testing.T) (*fakeControl, string) {
	t.Helper()
	f := &fakeControl{
		snaps: []*csisupdv1.VolumeSnapshot{
			{Id: "s1", PluginId: "tp", SourceVolumeId: "data", ExternalId: "snap-1", SizeBytes: 1 << 30, ReadyToUse: true,
				CreatedAt: timestamppb.New(snapTime), State: "created"},
			{Id: "s2", PluginId: "tp", SourceVolumeId: "logs", ExternalId: "snap-2", SizeBytes: 2 << 20,
				CreatedAt: timestamppb.New(snapTime), State: "created"},
		},
		volume: &csisupdv1.Volume{Id: "data", PluginId: "tp", ExternalId: "ext-data", CapacityBytes: 1 << 30,
			CapacityLimitBytes: 4 << 30, MutableParameters: map[string]string{"iops": "3000"},
			ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "s0"}},
			Expansion: &csisupdv1.VolumeExpansion{CapacityBytes: 2 << 30, LimitBytes: 4 << 30, State: "nodes",
				NodesPending: []string{"node-2", "node-3"}, NodesDone: []string{"node-1"},
				LastError: "node-2: NodeExpandVolume: device busy", StartedAt: timestamppb.New(snapTime)}},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csisupdv1.RegisterControlServer(g, f)
	testutil.ServeGRPC(t, ln, g)
	return f, ln.Addr().String()
}

// The new volume commands send the requests their flags describe and
// print the answers, as text and as protojson.
func TestVolumeCommandsAgainstControl(t *testing.T) {
	f, addr := startFakeControl(t)
	tests := []struct {
		name string
		args []string
		// want is the request the server gets.
		want proto.Message
		// out is the exact text printed; contains lists parts of it.
		out      string
		contains []string
	}{
		{name: "create with topology and a snapshot",
			args: []string{"volume", "create", "data", "--plugin", "tp", "--topology-required", "zone=a", "--snapshot", "s1"},
			want: &csisupdv1.VolumeCreateRequest{Id: "data", PluginId: "tp",
				Capabilities:              []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: segs(map[string]string{"zone": "a"})},
				ContentSource:             &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "s1"}}},
			out: "Created volume data (plugin tp, external id ext-data)\n"},
		{name: "snapshot create",
			args: []string{"volume", "snapshot", "create", "data", "s1", "--parameter", "type=full", "--secret", "k=s3cr3t"},
			want: &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "data", Id: "s1", Parameters: map[string]string{"type": "full"},
				Secrets: map[string]string{"k": "s3cr3t"}},
			out: "Created snapshot s1 of volume data (plugin tp, external id snap-1, 1.0 GiB, ready to use)\n"},
		{name: "snapshot list, every page",
			args: []string{"volume", "snapshot", "list", "--page-size", "1"},
			want: &csisupdv1.VolumeSnapshotListRequest{PageSize: 1, NextToken: "s2"},
			out: "ID  VOLUME  PLUGIN  EXTERNAL ID  SIZE     READY  STATE    CREATED\n" +
				"s1  data    tp      snap-1       1.0 GiB  true   created  " + formatTime(timestamppb.New(snapTime)) + "\n" +
				"s2  logs    tp      snap-2       2.0 MiB  false  created  " + formatTime(timestamppb.New(snapTime)) + "\n"},
		{name: "snapshot list of a volume",
			args:     []string{"volume", "snapshot", "list", "--volume", "logs", "--plugin", "tp", "--stale"},
			want:     &csisupdv1.VolumeSnapshotListRequest{VolumeId: "logs", PluginId: "tp", Stale: true},
			contains: []string{"s2  logs"}},
		{name: "snapshot list, none",
			args: []string{"volume", "snapshot", "list", "--volume", "nothing"},
			want: &csisupdv1.VolumeSnapshotListRequest{VolumeId: "nothing"},
			out:  "No snapshots.\n"},
		{name: "snapshot status",
			args:     []string{"volume", "snapshot", "status", "s2"},
			want:     &csisupdv1.VolumeSnapshotGetRequest{Id: "s2"},
			contains: []string{"ID:                 s2\n", "Volume:             logs\n", "Ready to use:       false\n", "Size:               2.0 MiB\n"}},
		{name: "snapshot delete",
			args: []string{"volume", "snapshot", "delete", "s1", "--secret", "k=v"},
			want: &csisupdv1.VolumeSnapshotDeleteRequest{Id: "s1", Secrets: map[string]string{"k": "v"}},
			out:  "Deleted snapshot s1\n"},
		{name: "expand",
			args: []string{"volume", "expand", "data", "--capacity", "2GiB"},
			want: &csisupdv1.VolumeExpandRequest{Id: "data", CapacityMinBytes: 2 << 30},
			out:  "Expanding volume data to 2.0 GiB: waiting for 2 node(s); last error: node-2: NodeExpandVolume: device busy (see volume status data)\n"},
		{name: "modify",
			args: []string{"volume", "modify", "data", "--parameter", "iops=6000"},
			want: &csisupdv1.VolumeModifyRequest{Id: "data", MutableParameters: map[string]string{"iops": "6000"}},
			out:  "Modified volume data: mutable parameters iops=6000\n"},
		{name: "status with an expansion under way",
			args: []string{"volume", "status", "data"},
			want: &csisupdv1.VolumeGetRequest{Id: "data"},
			contains: []string{
				"Capacity:           1.0 GiB\n",
				"Capacity limit:     4.0 GiB\n",
				"Content source:     snapshot s0\n",
				"Mutable parameters: iops=3000\n",
				"\nExpansion under way\n" +
					"Target:             2.0 GiB (limit 4.0 GiB)\n" +
					"State:              nodes\n" +
					"Started:            " + formatTime(timestamppb.New(snapTime)) + "\n" +
					"Nodes pending:      node-2, node-3\n" +
					"Nodes done:         node-1\n" +
					"Last error:         node-2: NodeExpandVolume: device busy\n",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := execute(t, append([]string{"--address", addr}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.last(); !proto.Equal(got, tt.want) {
				t.Errorf("request %v, want %v", got, tt.want)
			}
			if tt.out != "" && out != tt.out {
				t.Errorf("printed\n%s\nwant\n%s", out, tt.out)
			}
			for _, c := range tt.contains {
				if !strings.Contains(out, c) {
					t.Errorf("printed\n%s\nwithout %q", out, c)
				}
			}
			if strings.Contains(out, "s3cr3t") {
				t.Errorf("printed a secret:\n%s", out)
			}
		})
	}

	// --json prints the API message of each answer.
	jsonTests := []struct {
		args  []string
		check func(doc map[string]any) bool
	}{
		{[]string{"volume", "snapshot", "create", "data", "s1"}, func(d map[string]any) bool {
			return d["id"] == "s1" && d["size_bytes"] == "1073741824" && d["ready_to_use"] == true
		}},
		{[]string{"volume", "snapshot", "status", "s1"}, func(d map[string]any) bool { return d["id"] == "s1" && d["state"] == "created" }},
		{[]string{"volume", "snapshot", "delete", "s1"}, func(d map[string]any) bool { return len(d) == 0 }},
		{[]string{"volume", "expand", "data", "--capacity", "2GiB"}, func(d map[string]any) bool {
			e, _ := d["expansion"].(map[string]any)
			return d["id"] == "data" && e["capacity_bytes"] == "2147483648" && e["state"] == "nodes"
		}},
		{[]string{"volume", "modify", "data", "--parameter", "iops=6000"}, func(d map[string]any) bool {
			m, _ := d["mutable_parameters"].(map[string]any)
			return d["id"] == "data" && m["iops"] == "6000"
		}},
	}
	for _, tt := range jsonTests {
		doc := mustJSON(t, append([]string{"--address", addr}, tt.args...)...)
		if !tt.check(doc) {
			b, _ := json.Marshal(doc)
			t.Errorf("%s --json: %s", strings.Join(tt.args, " "), b)
		}
	}

	if _, err := execute(t, "--address", addr, "volume", "snapshot", "status", "nope"); err == nil || !strings.Contains(err.Error(), `snapshot "nope" not found`) {
		t.Errorf("status of an unknown snapshot: %v", err)
	}
}

// Until the servers implement a call, the command says so rather than
// failing in a way that hides it.
func TestVolumeCommandsUnimplemented(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csisupdv1.RegisterControlServer(g, csisupdv1.UnimplementedControlServer{})
	testutil.ServeGRPC(t, ln, g)
	for _, args := range [][]string{
		{"volume", "expand", "v", "--capacity", "1GiB"},
		{"volume", "modify", "v", "--parameter", "a=b"},
		{"volume", "snapshot", "create", "v", "s"},
		{"volume", "snapshot", "list"},
		{"volume", "snapshot", "delete", "s"},
	} {
		_, err := execute(t, append([]string{"--address", ln.Addr().String()}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "not implemented") {
			t.Errorf("%s against a server without it: %v", strings.Join(args, " "), err)
		}
	}
}

// Usage errors of the new commands exit with code 2, naming the flag.
func TestVolumeUsageExitCodes(t *testing.T) {
	for _, args := range [][]string{
		{"volume", "create", "v", "--plugin", "p", "--snapshot", "s", "--clone", "c"},
		{"volume", "create", "v", "--plugin", "p", "--topology-required", "zone"},
		{"volume", "create", "--plugin", "p"},
		{"volume", "expand", "v"},
		{"volume", "modify", "v"},
		{"volume", "snapshot", "create", "v"},
		{"volume", "snapshot", "list", "extra"},
		{"volume", "snapshot", "delete"},
	} {
		if got := run(args); got != exitUsage {
			t.Errorf("%s: exit code %d, want %d", strings.Join(args, " "), got, exitUsage)
		}
	}
}
