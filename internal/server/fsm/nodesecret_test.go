package fsm

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// registerKeyed is a registration of node id named name with a secret.
func registerKeyed(id, name, secret string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_NodeUpsert{NodeUpsert: &statepb.ClusterNode{
		Id: id, Name: name, Address: id + ":4780", SecretHash: rules.SecretHash(secret),
	}}}
}

func rekey(id string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_NodeRekey{NodeRekey: &statepb.NodeRekeyCommand{NodeId: id}}}
}

// TestFSMNodeSecrets applies registrations as raft would: the FSM refuses
// another secret for a node, and a live node's name for another id,
// whatever the leader checked before; a rekey lets the next secret in, and
// another id take the name, replacing the rekeyed node.
func TestFSMNodeSecrets(t *testing.T) {
	events := testEvents(t, 16, 8)
	f, err := newFSM(events)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		entry *statepb.LogEntry
		code  codes.Code
		msg   string
	}{
		{registerKeyed("n1", "web-1", "s1"), codes.OK, ""},
		{registerKeyed("n1", "web-1", "s1"), codes.OK, ""},
		{registerKeyed("n1", "web-1", "forged"), codes.PermissionDenied, "node secret does not match"},
		{registerKeyed("n2", "web-1", "s2"), codes.AlreadyExists, `node name "web-1" is held by node "n1"`},
		{registerKeyed("n2", "web-2", "s2"), codes.OK, ""},
		// An entry of an earlier release (no secret) keeps the stored hash.
		{register("n2"), codes.OK, ""},
		{registerKeyed("n2", "web-2", "forged"), codes.PermissionDenied, "node secret does not match"},
		{rekey("ghost"), codes.NotFound, ""},
		{rekey("n1"), codes.OK, ""},
		{registerKeyed("n3", "web-1", "s3"), codes.OK, ""},
		{registerKeyed("n1", "web-1", "s1"), codes.PermissionDenied, `replaced by node "n3"`},
	}
	var entries []*statepb.LogEntry
	for _, s := range steps {
		entries = append(entries, s.entry)
	}
	for i, r := range applyAll(t, f, entries...) {
		want := steps[i]
		if want.code == codes.NotFound {
			if r.Err == nil || !strings.Contains(r.Err.Error(), "not found") {
				t.Errorf("step %d: %v, want not found", i, r.Err)
			}
			continue
		}
		if got := status.Code(r.Err); got != want.code || !strings.Contains(status.Convert(r.Err).Message(), want.msg) {
			t.Errorf("step %d: %v, want %s containing %q", i, r.Err, want.code, want.msg)
		}
	}
	st := f.State()
	if n := st.Node("n2"); string(n.GetSecretHash()) != string(rules.SecretHash("s2")) {
		t.Errorf("n2's hash after an entry of an earlier release: %x", n.GetSecretHash())
	}
	old, repl := st.Node("n1"), st.Node("n3")
	if old.GetReplacedBy() != "n3" || old.GetStatus() != state.NodeStatusDown || len(old.GetSecretHash()) != 0 {
		t.Errorf("n1 after n3 took its name: %v", old)
	}
	if repl.GetName() != "web-1" || repl.GetRekeyed() || repl.GetStatus() != state.NodeStatusReady {
		t.Errorf("n3: %v", repl)
	}
	if got := st.NodesNamed("web-1"); len(got) != 2 {
		t.Errorf("nodes named web-1: %v, want the replaced n1 and n3", got)
	}
	var types []string
	for _, e := range readAll(t, events, 0) {
		types = append(types, e.Payload.GetType())
	}
	if got, want := strings.Join(types, ","), "node-registered,node-registered,node-registered,node-registered,node-rekeyed,node-replaced,node-registered"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}
