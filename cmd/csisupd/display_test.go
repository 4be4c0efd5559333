package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// hostile is a name with a colour escape, a carriage return, a newline
// and a right-to-left override, as a plugin or a file name could carry.
const hostile = "p\x1b[31mred\rover\nline\u202eevil"

func TestDisplay(t *testing.T) {
	tests := []struct{ in, want string }{
		{"csi.example.com", "csi.example.com"},
		{"Müller 日本語 ✓", "Müller 日本語 ✓"}, // printable non-ASCII stays as it is
		{"", ""},
		{`back\slash "quoted"`, `back\slash "quoted"`},
		{"\x1b[31mred", `"\x1b[31mred"`},
		{"a\rb", `"a\rb"`},
		{"a\nb", `"a\nb"`},
		{"tab\there", `"tab\there"`},
		{"bidi\u202eevil", `"bidi\u202eevil"`},
		{"zero\u200bwidth", `"zero\u200bwidth"`},
		{"line\u2028sep", `"line\u2028sep"`},
		{"c1\u009bcsi", `"c1\u009bcsi"`},
		{"bad\xffutf8", `"bad\xffutf8"`},
		{hostile, `"p\x1b[31mred\rover\nline\u202eevil"`},
	}
	for _, tt := range tests {
		got := display(tt.in)
		if got != tt.want {
			t.Errorf("display(%q) = %s, want %s", tt.in, got, tt.want)
		}
		if again := display(got); again != got {
			t.Errorf("display(display(%q)) = %s, want it unchanged", tt.in, again)
		}
		if err := terminalSafe(got); err != nil {
			t.Errorf("display(%q): %v", tt.in, err)
		}
	}
	if got, want := displayLines("first\x1b[2J\nsecond"), "\"first\\x1b[2J\"\nsecond"; got != want {
		t.Errorf("displayLines = %q, want %q", got, want)
	}
}

// terminalSafe reports the first rune of out a terminal would interpret:
// anything but printable runes, spaces and line breaks.
func terminalSafe(out string) error {
	if !utf8.ValidString(out) {
		return fmt.Errorf("invalid UTF-8 in output %s", display(out))
	}
	for i, r := range out {
		if r != '\n' && !unicode.IsPrint(r) {
			return fmt.Errorf("raw %U at byte %d of output %s", r, i, display(out))
		}
	}
	return nil
}

// Every text output built from strings of agents, servers, plugins and file
// systems escapes them: no control or format character reaches the
// terminal, no outside string adds a line, and the escaped form shows.
func TestTextOutputEscapesOutsideStrings(t *testing.T) {
	at := timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	plugin := &csisupdv1.Plugin{Id: hostile, Type: hostile, HealthState: hostile, HealthDescription: hostile,
		VendorName: hostile, VendorVersion: hostile, NodeId: hostile, Socket: hostile}
	node := &csisupdv1.ClusterNode{Id: hostile, Name: hostile, Address: hostile, Status: hostile,
		StatusDescription: hostile, Plugins: []*csisupdv1.Plugin{plugin}}
	cplugin := &csisupdv1.ClusterPlugin{Id: hostile, Provider: hostile, Version: hostile,
		Instances: []*csisupdv1.PluginInstance{{NodeId: hostile, NodeName: hostile, HealthDescription: hostile, Plugin: plugin}}}
	volume := &csisupdv1.Volume{Id: hostile, PluginId: hostile, ExternalId: hostile, ControllerNodeId: hostile,
		Capabilities:  []*csisupdv1.VolumeCapability{{AccessType: hostile, AccessMode: hostile, FsType: hostile}},
		Claims:        []*csisupdv1.VolumeClaim{{NodeId: hostile, CsiNodeId: hostile}},
		ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: hostile}},
		Parameters:    map[string]string{hostile: hostile}, MutableParameters: map[string]string{hostile: hostile},
		AccessibleTopology: []*csisupdv1.TopologySegment{{Segments: map[string]string{hostile: hostile}}},
		Expansion: &csisupdv1.VolumeExpansion{CapacityBytes: 1 << 30, State: hostile, NodesPending: []string{hostile},
			NodesDone: []string{hostile}, LastError: hostile}}
	snapshot := &csisupdv1.VolumeSnapshot{Id: hostile, PluginId: hostile, SourceVolumeId: hostile, ExternalId: hostile,
		State: hostile, ControllerNodeId: hostile, LastError: hostile,
		AccessibleTopology: []*csisupdv1.TopologySegment{{Segments: map[string]string{hostile: hostile}}}}
	tests := []struct {
		name  string
		print func(w *bytes.Buffer) error
		lines int // lines the output must have
	}{
		{"status", func(w *bytes.Buffer) error {
			return printStatus(w, &csisupdv1.StatusResponse{Name: hostile, Version: hostile, PluginDir: hostile,
				Plugins: []*csisupdv1.Plugin{plugin},
				Ignored: []*csisupdv1.IgnoredEntry{{Path: hostile, Reason: hostile}},
				Cluster: &csisupdv1.ClusterSummary{NodeId: hostile, Server: true, Servers: []string{hostile}, Leader: hostile}})
		}, 11},
		{"events", func(w *bytes.Buffer) error {
			return printEvent(w, &csisupdv1.Event{Index: 1, Time: at, Type: hostile, PluginId: hostile, Description: hostile}, false)
		}, 1},
		{"plugin status", func(w *bytes.Buffer) error { return printPluginList(w, []*csisupdv1.ClusterPlugin{cplugin}) }, 2},
		{"plugin status ID", func(w *bytes.Buffer) error { return printPlugin(w, cplugin) }, 9},
		{"node status", func(w *bytes.Buffer) error { return printNodeList(w, []*csisupdv1.ClusterNode{node}) }, 2},
		{"node status ID", func(w *bytes.Buffer) error { return printNode(w, node) }, 10},
		{"volume list", func(w *bytes.Buffer) error { return printVolumeList(w, []*csisupdv1.Volume{volume}, nil) }, 2},
		{"volume status", func(w *bytes.Buffer) error { return printVolume(w, volume, nil) }, 25},
		{"volume expand", func(w *bytes.Buffer) error { return printExpandResult(w, volume) }, 1},
		{"volume snapshot list", func(w *bytes.Buffer) error { return printSnapshotList(w, []*csisupdv1.VolumeSnapshot{snapshot}) }, 2},
		{"volume snapshot status", func(w *bytes.Buffer) error { return printSnapshot(w, snapshot) }, 11},
		{"volume create", func(w *bytes.Buffer) error { return printVolumeResult(w, false, "Created", volume) }, 1},
		{"agent error", func(w *bytes.Buffer) error {
			w.WriteString(agentError(hostile, status.Error(codes.Internal, hostile)).Error() + "\n")
			return nil
		}, 1},
		{"control error", func(w *bytes.Buffer) error {
			w.WriteString(controlError("addr", status.Error(codes.Unavailable, hostile)).Error() + "\n")
			return nil
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := tt.print(&out); err != nil {
				t.Fatal(err)
			}
			s := out.String()
			if err := terminalSafe(s); err != nil {
				t.Error(err)
			}
			if n := strings.Count(s, "\n"); n != tt.lines {
				t.Errorf("%d lines, want %d:\n%s", n, tt.lines, s)
			}
			if !strings.Contains(s, `\x1b[31mred\rover\nline\u202eevil`) {
				t.Errorf("output does not show the escaped name:\n%s", s)
			}
		})
	}
}
