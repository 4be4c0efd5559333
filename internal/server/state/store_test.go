package state

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// write runs fn in a write transaction and commits it.
func write(t *testing.T, s *Store, fn func(*Txn) error) {
	t.Helper()
	txn := s.Write()
	defer txn.Abort()
	if err := fn(txn); err != nil {
		t.Fatal(err)
	}
	txn.Commit()
}

// putNode writes a node with its plugins, as the FSM does.
func putNode(txn *Txn, n *statepb.ClusterNode) ([]string, error) {
	var old []*statepb.Plugin
	if prev := txn.Node(n.GetId()); prev != nil {
		old = prev.GetPlugins()
	}
	if err := txn.PutNode(n); err != nil {
		return nil, err
	}
	return txn.SetNodePlugins(n.GetId(), old, n.GetPlugins())
}

func TestWritesAreSeenAfterCommitOnly(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	txn := s.Write()
	if err := txn.PutVolume(&statepb.Volume{Id: "v", PluginId: "p"}); err != nil {
		t.Fatal(err)
	}
	if txn.Volume("v") == nil {
		t.Fatal("the transaction does not see its own write")
	}
	if s.Volume("v") != nil {
		t.Fatal("a reader sees an uncommitted write")
	}
	txn.Abort()
	if s.Volume("v") != nil {
		t.Fatal("an aborted write is visible")
	}
	write(t, s, func(txn *Txn) error {
		if err := txn.DeleteACLPolicy("nope"); !errors.Is(err, ErrNotFound) {
			t.Errorf("delete of a missing policy: %v, want ErrNotFound", err)
		}
		return txn.SetLatestIndex(7)
	})
	if s.LatestIndex() != 7 {
		t.Fatalf("latest index %d, want 7", s.LatestIndex())
	}
}

func TestPluginOfItsInstancesAndCollected(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	mono := &statepb.Plugin{Id: "p", Type: string(plugin.TypeMonolith), Healthy: true}
	write(t, s, func(txn *Txn) error {
		for _, n := range []*statepb.ClusterNode{
			{Id: "a", Status: NodeStatusReady, Plugins: []*statepb.Plugin{mono}},
			{Id: "b", Status: NodeStatusDown, Plugins: []*statepb.Plugin{mono}},
		} {
			if _, err := putNode(txn, n); err != nil {
				return err
			}
		}
		return nil
	})
	p := s.Plugin("p")
	if p == nil || p.ControllersExpected != 2 || p.ControllersHealthy != 1 || p.NodesHealthy != 1 {
		t.Fatalf("plugin %v: want 2 controllers and nodes expected, 1 healthy (node b is down)", p)
	}
	if c := s.Counts(); c.Plugins != 1 || c.Nodes[NodeStatusReady] != 1 || c.Nodes[NodeStatusDown] != 1 {
		t.Fatalf("counts %+v", c)
	}
	var gc []string
	write(t, s, func(txn *Txn) error {
		for _, id := range []string{"a", "b"} {
			n := CopyNode(txn.Node(id))
			n.Plugins = nil
			got, err := putNode(txn, n)
			if err != nil {
				return err
			}
			gc = append(gc, got...)
		}
		return nil
	})
	if !slices.Equal(gc, []string{"p"}) || s.Plugin("p") != nil {
		t.Fatalf("collected %v, plugin %v: want p collected with its last instance", gc, s.Plugin("p"))
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, func(txn *Txn) error {
		if _, err := putNode(txn, &statepb.ClusterNode{Id: "a", Status: NodeStatusReady,
			Plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeNode), Healthy: true}}}); err != nil {
			return err
		}
		if err := txn.PutServer(&statepb.ServerRecord{Id: "s1", RpcAddress: "h:1"}); err != nil {
			return err
		}
		return txn.SetLatestIndex(5)
	})
	data, err := EncodeSnapshot(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := FromSnapshot(snap, 9)
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Plugin("p"); p == nil || p.NodesHealthy != 1 || r.Server("s1").GetRpcAddress() != "h:1" || r.LatestIndex() != 9 {
		t.Fatalf("restored: plugin %v, server %v, index %d", r.Plugin("p"), r.Server("s1"), r.LatestIndex())
	}
	snap.Version = 2
	if _, err := FromSnapshot(snap, 9); err == nil || !strings.Contains(err.Error(), "unsupported version 2") {
		t.Fatalf("restore of version 2: %v", err)
	}
	if _, err := DecodeSnapshot([]byte("garbage")); err == nil {
		t.Fatal("decode of garbage succeeded")
	}
}

// TestCopyNodeKeepsEveryField sets every field of a node and requires its
// copy to equal it: a field added to the row without CopyNode learning it
// would be dropped by every status change (the node secret's hash was).
func TestCopyNodeKeepsEveryField(t *testing.T) {
	n := &statepb.ClusterNode{}
	m := n.ProtoReflect()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case fd.IsList() && fd.Message() != nil:
			m.Mutable(fd).List().Append(protoreflect.ValueOfMessage(m.Mutable(fd).List().NewElement().Message()))
		case fd.IsList():
			m.Mutable(fd).List().Append(protoreflect.ValueOfString("x"))
		case fd.Message() != nil:
			m.Set(fd, protoreflect.ValueOfMessage(timestamppb.Now().ProtoReflect()))
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("x"))
		case fd.Kind() == protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte("x")))
		case fd.Kind() == protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		case fd.Kind() == protoreflect.Uint64Kind:
			m.Set(fd, protoreflect.ValueOfUint64(7))
		default:
			t.Fatalf("field %s of kind %s: teach this test", fd.Name(), fd.Kind())
		}
	}
	if c := CopyNode(n); !proto.Equal(c, n) {
		t.Fatalf("CopyNode dropped fields:\n got  %v\n want %v", c, n)
	}
}

func TestNodesWithStatus(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, func(txn *Txn) error {
		for _, n := range []*statepb.ClusterNode{
			{Id: "c", Status: NodeStatusDown},
			{Id: "a", Status: NodeStatusReady},
			{Id: "b", Status: NodeStatusDown},
			{Id: "d"}, // no status: stored, in no status
		} {
			if _, err := putNode(txn, n); err != nil {
				return err
			}
		}
		return nil
	})
	// A node that comes back leaves the down nodes.
	write(t, s, func(txn *Txn) error {
		_, err := putNode(txn, &statepb.ClusterNode{Id: "c", Status: NodeStatusReady})
		return err
	})
	for _, tc := range []struct {
		status string
		want   []string
	}{
		{NodeStatusDown, []string{"b"}},
		{NodeStatusReady, []string{"a", "c"}},
		{NodeStatusInitializing, nil},
		{"", nil},
	} {
		var got []string
		for _, n := range s.NodesWithStatus(tc.status) {
			got = append(got, n.GetId())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("NodesWithStatus(%q) = %v, want %v", tc.status, got, tc.want)
		}
	}
}
