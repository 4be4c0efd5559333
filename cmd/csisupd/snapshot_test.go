package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// getVolume returns a volume as volume status --json prints it.
func getVolume(t *testing.T, addr, id string) *csisupdv1.Volume {
	t.Helper()
	v := &csisupdv1.Volume{}
	getJSON(t, v, "--address", addr, "volume", "status", id)
	return v
}

// getSnapshot returns a snapshot as volume snapshot status --json prints
// it.
func getSnapshot(t *testing.T, addr, id string) *csisupdv1.VolumeSnapshot {
	t.Helper()
	s := &csisupdv1.VolumeSnapshot{}
	getJSON(t, s, "--address", addr, "volume", "snapshot", "status", id)
	return s
}

// getJSON runs the CLI with --json and decodes what it prints into m.
func getJSON(t *testing.T, m proto.Message, args ...string) {
	t.Helper()
	out, err := execute(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// fieldLine is one line of a status command's text: the label padded to
// the value's column.
func fieldLine(label, value string) string {
	return fmt.Sprintf("%-20s%s\n", label+":", value)
}

// lastSecrets returns the secrets of the last call of method the plugin
// got.
func lastSecrets(p *testplugin.Plugin, method string) map[string]string {
	all := p.Secrets(method)
	if len(all) == 0 {
		return nil
	}
	return all[len(all)-1]
}

// lifecyclePlugin is a node-local plugin with every controller capability,
// whose ControllerExpandVolume asks for node expansion.
var lifecyclePlugin = testplugin.Config{
	NodeID:                 "csi-a",
	NodeLocal:              true,
	ControllerCapabilities: testplugin.SupportedControllerCapabilities,
	NodeExpansionRequired:  true,
}

// The volume commands drive the cluster from their flags: a create's
// topology, capacity limit, mutable parameters and content source reach
// the plugin and the recorded volume; snapshots are taken, listed page by
// page, shown and deleted; modify and expand change the volume, and an
// expansion that a node fails stays recorded and shows in volume status.
func TestVolumeLifecycleCommands(t *testing.T) {
	c, addr, plugins := oneNodeClusterWith(t, map[string]testplugin.Config{"tp": lifecyclePlugin})
	a, p := c.Agent(0), plugins["tp"]
	cli := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := execute(t, append([]string{"--address", addr}, args...)...)
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		if strings.Contains(out, "s3cr3t") {
			t.Errorf("%s printed a secret:\n%s", strings.Join(args, " "), out)
		}
		return out
	}
	fail := func(t *testing.T, args ...string) error {
		t.Helper()
		_, err := execute(t, append([]string{"--address", addr}, args...)...)
		if err == nil {
			t.Fatalf("%s succeeded, want an error", strings.Join(args, " "))
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error %v shows a secret", strings.Join(args, " "), err)
		}
		return err
	}
	here := testplugin.DefaultTopologyKey + "=csi-a"
	hereTopology := []*csisupdv1.TopologySegment{{Segments: map[string]string{testplugin.DefaultTopologyKey: "csi-a"}}}
	checkVolume := func(v *csisupdv1.Volume, capacity, limit int64, mutable map[string]string, source *csisupdv1.VolumeContentSource) {
		t.Helper()
		if v.GetCapacityBytes() != capacity || v.GetCapacityLimitBytes() != limit || !maps.Equal(v.GetMutableParameters(), mutable) ||
			!proto.Equal(v.GetContentSource(), source) || v.GetControllerNodeId() != a.NodeID() ||
			len(v.GetAccessibleTopology()) != 1 || !proto.Equal(v.GetAccessibleTopology()[0], hereTopology[0]) {
			t.Errorf("volume %s: capacity %d, limit %d, mutable parameters %v, content source %v, controller %s, topology %v;\n"+
				"want %d, %d, %v, %v, %s, %v", v.GetId(), v.GetCapacityBytes(), v.GetCapacityLimitBytes(), v.GetMutableParameters(),
				v.GetContentSource(), v.GetControllerNodeId(), v.GetAccessibleTopology(), capacity, limit, mutable, source, a.NodeID(), hereTopology)
		}
	}
	pluginVolume := func(v *csisupdv1.Volume) testplugin.Volume {
		t.Helper()
		pv, ok := p.Volume(v.GetExternalId())
		if !ok {
			t.Fatalf("the plugin has no volume %s (volume %s)", v.GetExternalId(), v.GetId())
		}
		return pv
	}

	// Create: the topology, the capacity range and the mutable parameters
	// reach the plugin and are recorded.
	out := cli(t, "volume", "create", "data", "--plugin", "tp", "--capacity", "2MiB", "--capacity-max", "8MiB",
		"--mutable-parameter", "iops=3000", "--topology-required", here, "--topology-preferred", here, "--secret", "token=s3cr3t")
	data := getVolume(t, addr, "data")
	if want := "Created volume data (plugin tp, external id " + data.GetExternalId() + ")\n"; out != want || data.GetExternalId() == "" {
		t.Errorf("create printed %q, want %q", out, want)
	}
	checkVolume(data, 2<<20, 8<<20, map[string]string{"iops": "3000"}, nil)
	if pv := pluginVolume(data); pv.CapacityBytes != 2<<20 || !maps.Equal(pv.MutableParameters, map[string]string{"iops": "3000"}) ||
		!maps.Equal(pv.Topology, hereTopology[0].GetSegments()) {
		t.Errorf("the plugin's volume: %+v", pv)
	}
	if got := lastSecrets(p, "CreateVolume"); !maps.Equal(got, map[string]string{"token": "s3cr3t"}) {
		t.Errorf("CreateVolume got secrets %v", got)
	}

	// A create the cluster refuses records nothing.
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"topology the plugin is not in", []string{"--topology-required", testplugin.DefaultTopologyKey + "=csi-b"},
			"topology requirement [" + testplugin.DefaultTopologyKey + "=csi-b] cannot be met"},
		{"unknown snapshot", []string{"--snapshot", "nope"}, `create volume "refused": snapshot "nope" not found`},
		{"unknown source volume", []string{"--clone", "nope"}, `create volume "refused": source volume "nope" not found`},
	} {
		t.Run("create refused: "+tt.name, func(t *testing.T) {
			err := fail(t, append([]string{"volume", "create", "refused", "--plugin", "tp"}, tt.args...)...)
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want it to say %q", err, tt.want)
			}
			if _, err := execute(t, "--address", addr, "volume", "status", "refused"); err == nil || !strings.Contains(err.Error(), `volume "refused" not found`) {
				t.Errorf("status of the refused volume: %v", err)
			}
		})
	}

	// Snapshots of data, restored and cloned into new volumes: the clone,
	// created without a capacity, has the plugin's default size.
	out = cli(t, "volume", "snapshot", "create", "data", "s1", "--parameter", "type=full", "--secret", "k=s3cr3t")
	s1 := getSnapshot(t, addr, "s1")
	if want := "Created snapshot s1 of volume data (plugin tp, external id " + s1.GetExternalId() + ", 2 MiB, ready to use)\n"; out != want {
		t.Errorf("snapshot create printed %q, want %q", out, want)
	}
	if s1.GetPluginId() != "tp" || s1.GetSourceVolumeId() != "data" || !strings.HasPrefix(s1.GetExternalId(), "snap-") ||
		s1.GetSizeBytes() != 2<<20 || !s1.GetReadyToUse() || s1.GetState() != "created" || s1.GetControllerNodeId() != a.NodeID() ||
		!maps.Equal(s1.GetParameters(), map[string]string{"type": "full"}) || s1.GetCreatedAt() == nil || s1.GetLastError() != "" {
		t.Errorf("snapshot s1: %v", s1)
	}
	if got := lastSecrets(p, "CreateSnapshot"); !maps.Equal(got, map[string]string{"k": "s3cr3t"}) {
		t.Errorf("CreateSnapshot got secrets %v", got)
	}

	cli(t, "volume", "create", "logs", "--plugin", "tp", "--snapshot", "s1", "--capacity", "2MiB")
	logs := getVolume(t, addr, "logs")
	checkVolume(logs, 2<<20, 0, nil, &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "s1"}})
	if pv := pluginVolume(logs); pv.SourceSnapshotID != s1.GetExternalId() {
		t.Errorf("logs was restored from %q in the plugin, want %q", pv.SourceSnapshotID, s1.GetExternalId())
	}
	cli(t, "volume", "create", "copy", "--plugin", "tp", "--clone", "data")
	cp := getVolume(t, addr, "copy")
	checkVolume(cp, testplugin.DefaultVolumeSize, 0, nil, &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "data"}})
	if pv := pluginVolume(cp); pv.SourceVolumeID != data.GetExternalId() {
		t.Errorf("copy was cloned from %q in the plugin, want %q", pv.SourceVolumeID, data.GetExternalId())
	}
	cli(t, "volume", "snapshot", "create", "logs", "s2")
	s3 := mustJSON(t, "--address", addr, "volume", "snapshot", "create", "data", "s3")
	if s3["id"] != "s3" || s3["source_volume_id"] != "data" || s3["size_bytes"] != "2097152" || s3["ready_to_use"] != true || s3["state"] != "created" {
		t.Errorf("snapshot create --json: %v", s3)
	}

	// -f: the file's keys, with NAME and the flags given over them.
	spec := filepath.Join(t.TempDir(), "volume.hcl")
	if err := os.WriteFile(spec, []byte(`id = "from-file"
plugin_id = "tp"
capacity_min = "1MiB"
capacity_max = "16MiB"
snapshot_id = "s1"
topology_request {
  required {
    topology { segments = { "`+testplugin.DefaultTopologyKey+`" = "csi-a" } }
  }
}
mutable_parameters {
  tier = "gold"
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := cli(t, "volume", "create", "restored", "-f", spec, "--capacity", "3MiB", "--snapshot", "s2", "--mutable-parameter", "iops=100"); !strings.HasPrefix(out, "Created volume restored (plugin tp, external id vol-") {
		t.Errorf("create -f printed %q", out)
	}
	restored := getVolume(t, addr, "restored")
	checkVolume(restored, 3<<20, 16<<20, map[string]string{"tier": "gold", "iops": "100"},
		&csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "s2"}})
	if _, err := execute(t, "--address", addr, "volume", "status", "from-file"); err == nil {
		t.Error("create -f with NAME also created the file's id")
	}

	// Listing, over pages of every size: the same snapshots in id order.
	all := &csisupdv1.VolumeSnapshotListResponse{}
	getJSON(t, all, "--address", addr, "volume", "snapshot", "list")
	var ids []string
	for _, s := range all.GetSnapshots() {
		ids = append(ids, s.GetId())
	}
	if !slices.Equal(ids, []string{"s1", "s2", "s3"}) {
		t.Fatalf("snapshot list: %v, want s1, s2, s3", ids)
	}
	for _, size := range []string{"1", "2", "3"} {
		paged := &csisupdv1.VolumeSnapshotListResponse{}
		getJSON(t, paged, "--address", addr, "volume", "snapshot", "list", "--page-size", size)
		if len(paged.GetSnapshots()) != 3 || paged.NextToken != nil {
			t.Errorf("--page-size %s: %v", size, paged)
			continue
		}
		for i, s := range paged.GetSnapshots() {
			if !proto.Equal(s, all.GetSnapshots()[i]) {
				t.Errorf("--page-size %s: snapshot %d is %v, want %v", size, i, s, all.GetSnapshots()[i])
			}
		}
	}
	row := func(s *csisupdv1.VolumeSnapshot) []string {
		return []string{s.GetId(), s.GetSourceVolumeId(), "tp", s.GetExternalId(), "2", "MiB", "true", "created", formatTime(s.GetCreatedAt())}
	}
	header := []string{"ID", "VOLUME", "PLUGIN", "EXTERNAL", "ID", "SIZE", "READY", "STATE", "CREATED"}
	byID := map[string]*csisupdv1.VolumeSnapshot{}
	for _, s := range all.GetSnapshots() {
		byID[s.GetId()] = s
	}
	for _, tt := range []struct {
		args []string
		ids  []string
	}{
		{[]string{"--page-size", "1"}, []string{"s1", "s2", "s3"}},
		{[]string{"--volume", "data"}, []string{"s1", "s3"}},
		{[]string{"--volume", "logs", "--plugin", "tp", "--stale"}, []string{"s2"}},
		{[]string{"--volume", "data", "--page-size", "1"}, []string{"s1", "s3"}},
		{[]string{"--volume", "nothing"}, nil},
		{[]string{"--plugin", "other"}, nil},
	} {
		t.Run("snapshot list "+strings.Join(tt.args, " "), func(t *testing.T) {
			out := cli(t, append([]string{"volume", "snapshot", "list"}, tt.args...)...)
			if len(tt.ids) == 0 {
				if out != "No snapshots.\n" {
					t.Errorf("printed %q, want No snapshots.", out)
				}
				return
			}
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != len(tt.ids)+1 || !slices.Equal(strings.Fields(lines[0]), header) {
				t.Fatalf("printed\n%s\nwant a header and %d rows", out, len(tt.ids))
			}
			for i, id := range tt.ids {
				if got, want := strings.Fields(lines[i+1]), row(byID[id]); !slices.Equal(got, want) {
					t.Errorf("row %d: %q, want %q", i, got, want)
				}
				// The columns line up under the header.
				if strings.Index(lines[i+1], "2 MiB") != strings.Index(lines[0], "SIZE") {
					t.Errorf("row %d is not aligned with the header:\n%s", i, out)
				}
			}
		})
	}

	// Status of one snapshot, and of one the cluster does not have.
	s2 := byID["s2"]
	want := fieldLine("ID", "s2") + fieldLine("Volume", "logs") + fieldLine("Plugin", "tp") +
		fieldLine("External ID", s2.GetExternalId()) + fieldLine("Size", "2 MiB") + fieldLine("Ready to use", "true") +
		fieldLine("State", "created") + fieldLine("Controller", a.NodeID()) + fieldLine("Created", formatTime(s2.GetCreatedAt())) +
		fieldLine("Topology", here) + fieldLine("Last error", "-")
	if out := cli(t, "volume", "snapshot", "status", "s2"); out != want {
		t.Errorf("snapshot status printed\n%s\nwant\n%s", out, want)
	}
	if got := cli(t, "volume", "snapshot", "status", "s2", "--stale"); got != want {
		t.Errorf("snapshot status --stale printed\n%s\nwant\n%s", got, want)
	}
	if code := run([]string{"--address", addr, "volume", "snapshot", "status", "nope"}); code != exitError {
		t.Errorf("status of an unknown snapshot: exit code %d, want %d", code, exitError)
	}
	if err := fail(t, "volume", "snapshot", "status", "nope"); err.Error() != "server "+addr+" (leader "+c.Member(0).ID+" at "+addr+`): snapshot "nope" not found` {
		t.Errorf("status of an unknown snapshot: %v", err)
	}

	// Modify: the plugin gets the parameters and the cluster records them;
	// a key the plugin does not take changes nothing.
	if out := cli(t, "volume", "modify", "data", "--parameter", "iops=6000", "--secret", "k=s3cr3t"); out != "Modified volume data: mutable parameters iops=6000\n" {
		t.Errorf("modify printed %q", out)
	}
	if got := lastSecrets(p, "ControllerModifyVolume"); !maps.Equal(got, map[string]string{"k": "s3cr3t"}) {
		t.Errorf("ControllerModifyVolume got secrets %v", got)
	}
	modified := mustJSON(t, "--address", addr, "volume", "modify", "data", "--parameter", "throughput=100")
	if m, _ := modified["mutable_parameters"].(map[string]any); modified["id"] != "data" || m["throughput"] != "100" {
		t.Errorf("modify --json: %v", modified)
	}
	mutable := getVolume(t, addr, "data").GetMutableParameters()
	if pv := pluginVolume(data); !maps.Equal(pv.MutableParameters, mutable) || mutable["throughput"] != "100" {
		t.Errorf("mutable parameters: recorded %v, in the plugin %v", mutable, pv.MutableParameters)
	}
	if err := fail(t, "volume", "modify", "data", "--parameter", "colour=red"); !strings.Contains(err.Error(), "colour") {
		t.Errorf("modify of a key the plugin does not take: %v", err)
	}
	if got := getVolume(t, addr, "data").GetMutableParameters(); !maps.Equal(got, mutable) {
		t.Errorf("mutable parameters after a refused modify: %v, want %v", got, mutable)
	}

	// Expand, with the volume mounted on the node and the node's step
	// failing: the expansion stays recorded, waiting for the node.
	cli(t, "volume", "claim", "data", "--node", a.Name, "--workload", "job-1")
	p.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeExpandVolume": codes.Internal}})
	if code := run([]string{"--address", addr, "volume", "expand", "data", "--capacity", "4MiB"}); code != exitError {
		t.Errorf("expand with the node failing: exit code %d, want %d", code, exitError)
	}
	err := fail(t, "volume", "expand", "data", "--capacity", "4MiB")
	for _, part := range []string{`expand volume "data": node ` + a.NodeID() + ": ", "injected Internal error for NodeExpandVolume",
		"the expansion is recorded; the cluster keeps trying"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("expand with the node failing: %v; want it to say %q", err, part)
		}
	}
	for _, tt := range []struct{ capacity, want string }{
		{"6MiB", `an expansion to 4194304 bytes is under way (state nodes)`},
		{"16MiB", `16777216 bytes is over the volume's limit of 8388608 bytes`},
	} {
		if err := fail(t, "volume", "expand", "data", "--capacity", tt.capacity); !strings.Contains(err.Error(), tt.want) {
			t.Errorf("expand to %s during an expansion: %v, want %q", tt.capacity, err, tt.want)
		}
	}
	expanding := getVolume(t, addr, "data")
	e := expanding.GetExpansion()
	if e.GetState() != "nodes" || e.GetCapacityBytes() != 4<<20 || e.GetLimitBytes() != 8<<20 ||
		!slices.Equal(e.GetNodesPending(), []string{a.NodeID()}) || len(e.GetNodesDone()) != 0 || e.GetStartedAt() == nil ||
		!strings.HasPrefix(e.GetLastError(), "node "+a.NodeID()+": ") || !strings.Contains(e.GetLastError(), "injected Internal error for NodeExpandVolume") {
		t.Fatalf("expansion: %v", e)
	}
	status := cli(t, "volume", "status", "data")
	for _, part := range []string{
		fieldLine("Capacity", "4 MiB"),
		fieldLine("Capacity limit", "8 MiB"),
		fieldLine("Content source", "-"),
		fieldLine("Topology", here),
		fieldLine("Mutable parameters", formatMap(mutable)),
		"\nExpansion under way\n" +
			fieldLine("Target", "4 MiB (limit 8 MiB)") +
			fieldLine("State", "nodes") +
			fieldLine("Started", formatTime(e.GetStartedAt())) +
			fieldLine("Nodes pending", a.Name+" ("+a.NodeID()+")") +
			fieldLine("Nodes done", "-") +
			fieldLine("Last error", e.GetLastError()) +
			"\nClaims\n",
	} {
		if !strings.Contains(status, part) {
			t.Errorf("volume status printed\n%s\nwithout\n%s", status, part)
		}
	}
	if s := cli(t, "volume", "status", "logs"); !strings.Contains(s, fieldLine("Content source", "snapshot s1")) || strings.Contains(s, "Expansion under way") {
		t.Errorf("volume status logs printed\n%s", s)
	}
	var line bytes.Buffer
	if err := printExpandResult(&line, expanding); err != nil {
		t.Fatal(err)
	}
	if want := "Expanding volume data to 4 MiB: waiting for 1 node(s); last error: " + e.GetLastError() + " (see volume status data)\n"; line.String() != want {
		t.Errorf("expand result of the volume under way: %q, want %q", line.String(), want)
	}

	// Once the node works again the expansion ends, on the node too.
	p.SetFaults(testplugin.Faults{})
	if out := cli(t, "volume", "expand", "data", "--capacity", "4MiB"); out != "Expanded volume data: capacity 4 MiB\n" {
		t.Errorf("expand after the node recovered printed %q", out)
	}
	if v := getVolume(t, addr, "data"); v.GetExpansion() != nil || v.GetCapacityBytes() != 4<<20 {
		t.Errorf("volume after the expansion: capacity %d, expansion %v", v.GetCapacityBytes(), v.GetExpansion())
	}
	if nv := p.NodeVolumes()[data.GetExternalId()]; nv.CapacityBytes != 4<<20 {
		t.Errorf("the node sees %d bytes, want %d", nv.CapacityBytes, 4<<20)
	}
	grown := mustJSON(t, "--address", addr, "volume", "expand", "data", "--capacity", "5MiB")
	if grown["id"] != "data" || grown["capacity_bytes"] != "5242880" || grown["expansion"] != nil {
		t.Errorf("expand --json: %v", grown)
	}
	if nv := p.NodeVolumes()[data.GetExternalId()]; nv.CapacityBytes != 5<<20 {
		t.Errorf("the node sees %d bytes, want %d", nv.CapacityBytes, 5<<20)
	}
	cli(t, "volume", "release", "data", "--node", a.NodeID(), "--workload", "job-1")

	// Delete: the plugin forgets the snapshot, and so does the cluster.
	if out := cli(t, "volume", "snapshot", "delete", "s1", "--secret", "k=s3cr3t"); out != "Deleted snapshot s1\n" {
		t.Errorf("snapshot delete printed %q", out)
	}
	if got := lastSecrets(p, "DeleteSnapshot"); !maps.Equal(got, map[string]string{"k": "s3cr3t"}) {
		t.Errorf("DeleteSnapshot got secrets %v", got)
	}
	if del := mustJSON(t, "--address", addr, "volume", "snapshot", "delete", "s3"); len(del) != 0 {
		t.Errorf("snapshot delete --json: %v, want {}", del)
	}
	for _, id := range []string{"s1", "s3"} {
		if err := fail(t, "volume", "snapshot", "status", id); !strings.Contains(err.Error(), fmt.Sprintf("snapshot %q not found", id)) {
			t.Errorf("status of deleted snapshot %s: %v", id, err)
		}
	}
	var left []string
	for _, s := range p.Snapshots() {
		left = append(left, s.ID)
	}
	if !slices.Equal(left, []string{s2.GetExternalId()}) {
		t.Errorf("the plugin's snapshots: %v, want only s2's %s", left, s2.GetExternalId())
	}
	if out := cli(t, "volume", "snapshot", "list", "--volume", "data"); out != "No snapshots.\n" {
		t.Errorf("snapshots of data after the deletes: %q", out)
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
