package journal

import (
	"strings"
	"testing"
)

func TestSingleWriter(t *testing.T) {
	ab := []string{"a", "b"}
	tests := []struct {
		name  string
		steps []step
		want  []summary
	}{
		{
			name: "two writers overlapping by 1 ms",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 98, 100),
				pub("b", "v1", snw, false, 99, 101),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "writer unpublished before the next publishes",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 98, 100),
				pub("b", "v1", snw, false, 101, 102),
			},
		},
		{
			name: "unpublish ending at the instant the next publish begins",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 98, 100),
				pub("b", "v1", snw, false, 100, 102),
			},
		},
		{
			name: "publish counts from its begin record",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 98, 100),
				// The answer came after the unpublish ended, the call
				// began before: it may have taken effect at once.
				pub("b", "v1", snw, false, 99, 500),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "read-only publish beside a writer",
			steps: []step{
				pub("a", "v1", mnsw, false, 0, 1),
				pub("b", "v1", mnsw, true, 10, 11),
				pub("c", "v1", mnsw, true, 20, 21),
			},
		},
		{
			name: "reader-only access mode without the readonly flag",
			steps: []step{
				pub("a", "v1", mnro, false, 0, 1),
				pub("b", "v1", mnro, false, 10, 11),
			},
		},
		{
			name: "failed publish",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1),
				failed(pub("b", "v1", snw, false, 10, 11), "FailedPrecondition"),
			},
		},
		{
			name: "publish of unknown outcome counts",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1),
				pub("b", "v1", snw, false, 10, noEnd),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "failed unpublish leaves the writer",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), failed(unpub("a", "v1", 5, 6), "Internal"),
				pub("b", "v1", snw, false, 10, 11),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "unpublish of unknown outcome leaves the writer",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 5, noEnd),
				pub("b", "v1", snw, false, 10, 11),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "repeated publish does not outlive the unpublish",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), pub("a", "v1", snw, false, 10, 11), unpub("a", "v1", 20, 21),
				pub("b", "v1", snw, false, 30, 31),
			},
		},
		{
			name: "publish again on the first node overlapping the second",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 20, 21),
				pub("b", "v1", snw, false, 30, 31),
				pub("a", "v1", snw, false, 40, 41),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "multi-writer volume",
			steps: []step{
				pub("a", "v1", mnmw, false, 0, 1),
				pub("b", "v1", mnmw, false, 10, 11),
			},
		},
		{
			name: "a single writer beside a multi-writer publish",
			steps: []step{
				pub("a", "v1", mnmw, false, 0, 1),
				pub("b", "v1", mnsw, false, 10, 11),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}},
		},
		{
			name: "two writers on one node",
			steps: []step{
				pub("a", "v1", snmw, false, 0, 1),
				{node: "a", method: "NodePublishVolume", vol: "v1", path: "/other", mode: snmw, begin: 10, end: 11},
			},
		},
		{
			name: "different volumes",
			steps: []step{
				pub("a", "v1", snsw, false, 0, 1),
				pub("b", "v2", snsw, false, 10, 11),
			},
		},
		{
			name: "every overlapping pair",
			steps: []step{
				pub("a", "v1", snw, false, 0, 1),
				pub("b", "v1", snw, false, 10, 11),
				pub("c", "v1", snw, false, 20, 21),
				pub("a", "v2", snw, false, 0, 1),
			},
			want: []summary{{CheckSingleWriter, "v1", ab}, {CheckSingleWriter, "v1", []string{"a", "c"}}, {CheckSingleWriter, "v1", []string{"b", "c"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SingleWriter(build(tt.steps...))
			if !equalSummaries(summarise(got), tt.want) {
				t.Fatalf("SingleWriter = %v, want %v\n%v", summarise(got), tt.want, got)
			}
		})
	}
}

func TestSingleNode(t *testing.T) {
	ab := []string{"a", "b"}
	tests := []struct {
		name  string
		steps []step
		want  []summary
	}{
		{
			name:  "staged on two nodes",
			steps: []step{stage("a", "v1", snw, 0, 1), stage("b", "v1", snw, 50, 51)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			name:  "unstaged before the other node stages",
			steps: []step{stage("a", "v1", snw, 0, 1), unstage("a", "v1", 90, 100), stage("b", "v1", snw, 150, 151)},
		},
		{
			name:  "overlapping by 1 ms",
			steps: []step{stage("a", "v1", snw, 0, 1), unstage("a", "v1", 90, 100), stage("b", "v1", snw, 99, 151)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			name: "read-only publish on one node, staged on another",
			steps: []step{
				stage("a", "v1", snro, 0, 1), pub("a", "v1", snro, true, 2, 3), unstage("a", "v1", 4, 5),
				stage("b", "v1", snro, 10, 11),
			},
			want: []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			name:  "multi-node reader",
			steps: []step{stage("a", "v1", mnro, 0, 1), stage("b", "v1", mnro, 10, 11)},
		},
		{
			name:  "failed stage",
			steps: []step{stage("a", "v1", snw, 0, 1), failed(stage("b", "v1", snw, 10, 11), "FailedPrecondition")},
		},
		{
			name:  "stage of unknown outcome",
			steps: []step{stage("a", "v1", snw, 0, 1), stage("b", "v1", snw, 10, noEnd)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			name:  "staged and published on one node",
			steps: []step{stage("a", "v1", snsw, 0, 1), pub("a", "v1", snsw, false, 2, 3)},
		},
		{
			// The plugin says it holds nothing at the staging path: the
			// stage of unknown outcome had not happened.
			name:  "stage of unknown outcome, then NotFound from its unstage",
			steps: []step{stage("b", "v1", snw, 0, noEnd), afterRestart(failed(unstage("b", "v1", 10, 11), "NotFound")), stage("a", "v1", snw, 20, 21)},
		},
		{
			// The plugin that never answered the stage may still do it.
			name:  "stage of unknown outcome, unstaged by the same instance",
			steps: []step{stage("b", "v1", snw, 0, noEnd), unstage("b", "v1", 10, 11), stage("a", "v1", snw, 20, 21)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			// An unstage that began before the stage ended may have come
			// first: the plugin staged late, after its caller gave up.
			name:  "unstaged while the stage was still running",
			steps: []step{stage("b", "v1", snw, 0, 30), unstage("b", "v1", 10, 11), stage("a", "v1", snw, 40, 41)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
		{
			name:  "unstaged after the stage ended",
			steps: []step{stage("b", "v1", snw, 0, 30), unstage("b", "v1", 30, 31), stage("a", "v1", snw, 40, 41)},
		},
		{
			name:  "stage of unknown outcome, then a failed unstage",
			steps: []step{stage("b", "v1", snw, 0, noEnd), failed(unstage("b", "v1", 10, 11), "Internal"), stage("a", "v1", snw, 20, 21)},
			want:  []summary{{CheckSingleNode, "v1", ab}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := SingleNode(build(tt.steps...))
			if !equalSummaries(summarise(got), tt.want) {
				t.Fatalf("SingleNode = %v, want %v\n%v", summarise(got), tt.want, got)
			}
		})
	}
}

func TestLeftovers(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
		held  []string // "volume@node"
		want  []summary
		// message is part of every violation's message.
		message string
	}{
		{
			name:    "published with no claim",
			steps:   []step{stage("a", "v1", snw, 0, 1), pub("a", "v1", snw, false, 2, 3)},
			want:    []summary{{CheckLeftovers, "v1", []string{"a"}}},
			message: "no claim holding it",
		},
		{
			name:  "published and held",
			steps: []step{stage("a", "v1", snw, 0, 1), pub("a", "v1", snw, false, 2, 3)},
			held:  []string{"v1@a"},
		},
		{
			name: "all undone and nothing held",
			steps: []step{
				stage("a", "v1", snw, 0, 1), pub("a", "v1", snw, false, 2, 3),
				unpub("a", "v1", 4, 5), unstage("a", "v1", 6, 7),
			},
		},
		{
			name: "held but unpublished",
			steps: []step{
				stage("a", "v1", snw, 0, 1), pub("a", "v1", snw, false, 2, 3),
				unpub("a", "v1", 4, 5), unstage("a", "v1", 6, 7),
			},
			held:    []string{"v1@a"},
			want:    []summary{{CheckLeftovers, "v1", []string{"a"}}},
			message: "not published",
		},
		{
			name:    "staged only, not held",
			steps:   []step{stage("a", "v1", snw, 0, 1), pub("a", "v1", snw, false, 2, 3), unpub("a", "v1", 4, 5)},
			want:    []summary{{CheckLeftovers, "v1", []string{"a"}}},
			message: "staged at",
		},
		{
			name:    "held on a node where it never was",
			steps:   []step{stage("a", "v1", mnmw, 0, 1), pub("a", "v1", mnmw, false, 2, 3), stage("b", "v2", snw, 0, 1)},
			held:    []string{"v1@a", "v1@b", "v2@b"},
			want:    []summary{{CheckLeftovers, "v1", []string{"b"}}, {CheckLeftovers, "v2", []string{"b"}}},
			message: "not published",
		},
		{
			name:  "failed publish and stage leave nothing",
			steps: []step{failed(stage("a", "v1", snw, 0, 1), "Internal"), failed(pub("a", "v1", snw, false, 2, 3), "FailedPrecondition")},
		},
		{
			name:    "publish of unknown outcome may be left",
			steps:   []step{pub("a", "v1", snw, false, 2, noEnd)},
			want:    []summary{{CheckLeftovers, "v1", []string{"a"}}},
			message: "unknown outcome",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held := func(vol, node string) bool {
				for _, h := range tt.held {
					if h == vol+"@"+node {
						return true
					}
				}
				return false
			}
			got := Leftovers(build(tt.steps...), held)
			if !equalSummaries(summarise(got), tt.want) {
				t.Fatalf("Leftovers = %v, want %v\n%v", summarise(got), tt.want, got)
			}
			for _, v := range got {
				if !strings.Contains(v.Message, tt.message) {
					t.Errorf("message %q does not say %q", v.Message, tt.message)
				}
			}
		})
	}
}

// TestViolationRecords checks a violation names the records that show it,
// with their files and lines.
func TestViolationRecords(t *testing.T) {
	got := SingleWriter(build(
		pub("a", "v1", snw, false, 0, 1), unpub("a", "v1", 98, 100),
		pub("b", "v1", snw, false, 99, 101),
	))
	if len(got) != 1 {
		t.Fatalf("got %d violations, want 1: %v", len(got), got)
	}
	var methods []string
	for _, r := range got[0].Records {
		methods = append(methods, r.Node+":"+r.Method+":"+r.Phase)
	}
	want := []string{"a:NodePublishVolume:begin", "a:NodePublishVolume:end", "a:NodeUnpublishVolume:begin", "b:NodePublishVolume:begin", "a:NodeUnpublishVolume:end", "b:NodePublishVolume:end"}
	if strings.Join(methods, " ") != strings.Join(want, " ") {
		t.Fatalf("records %v, want %v", methods, want)
	}
	s := got[0].String()
	for _, part := range []string{"a.jsonl:1:", "b.jsonl:2:", "SingleWriter: volume v1"} {
		if !strings.Contains(s, part) {
			t.Errorf("String() = %q, does not contain %q", s, part)
		}
	}
}
