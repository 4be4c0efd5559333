package fsm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The property test of the claim commands: random schedules of claim
// commands, each built by a "leader" from a view of the volumes that may
// be stale (as a leader that lost its term, or a step another step
// overtook, builds them), applied through the FSM in random order. After
// every command the state must keep the promise: never two writers on a
// single-writer volume, and every claim in a state the transitions reach.

// accessModeRules is what each access mode allows, written out here apart
// from package rules so that the test does not check the code with
// itself.
var accessModeRules = map[string]struct{ oneNode, oneWriter, readersOnly bool }{
	"SINGLE_NODE_WRITER":        {oneNode: true, oneWriter: true},
	"SINGLE_NODE_SINGLE_WRITER": {oneNode: true, oneWriter: true},
	"SINGLE_NODE_MULTI_WRITER":  {oneNode: true},
	"SINGLE_NODE_READER_ONLY":   {oneNode: true, readersOnly: true},
	"MULTI_NODE_READER_ONLY":    {readersOnly: true},
	"MULTI_NODE_SINGLE_WRITER":  {oneWriter: true},
	"MULTI_NODE_MULTI_WRITER":   {},
}

// schedule is one random run against a fresh FSM.
type schedule struct {
	t     *testing.T
	f     *FSM
	rnd   *rand.Rand
	modes map[string]string // volume id -> its access mode
	// views are earlier copies of the volumes, the stale states leaders
	// build commands from.
	views [][]*statepb.Volume
	// seen is the states each claim (by volume and claim index) went
	// through, in order.
	seen map[claimKey][]string
}

// claimKey names one claim of the schedule: a claim taken again has
// another index.
type claimKey struct {
	volumeID string
	index    uint64
}

var (
	propNodes     = []string{"n1", "n2", "n3"}
	propWorkloads = []string{"w1", "w2", "w3"}
)

func newSchedule(t *testing.T, seed uint64, checkTake func(rules.Reader, *statepb.Volume, *statepb.VolumeClaim) error) *schedule {
	f, err := New(Config{Events: testEvents(t, 64, 32)})
	if err != nil {
		t.Fatal(err)
	}
	if checkTake != nil {
		f.checkTake = checkTake
	}
	s := &schedule{t: t, f: f, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), modes: map[string]string{}, seen: map[claimKey][]string{}}
	for _, n := range propNodes {
		s.apply(register(n, &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-" + n}))
	}
	// One node down, so that its claims can be released without it (a
	// node_gone step needs its node down or gone).
	s.apply(setStatus(propNodes[len(propNodes)-1], state.NodeStatusDown))
	modes := make([]string, 0, len(accessModeRules))
	for m := range accessModeRules {
		modes = append(modes, m)
	}
	slices.Sort(modes)
	for i := range 3 {
		id := fmt.Sprintf("v%d", i)
		mode := modes[s.rnd.IntN(len(modes))]
		s.modes[id] = mode
		s.apply(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{
			Volume: &statepb.Volume{Id: id, PluginId: "p", ExternalId: "x-" + id,
				Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: mode}}},
		}}})
	}
	s.views = append(s.views, s.f.State().Volumes(""))
	return s
}

// apply applies one entry as raft would and returns its error.
func (s *schedule) apply(e *statepb.LogEntry) error {
	e.Time = timestamppb.Now()
	return applyAll(s.t, s.f, e)[0].Err
}

// viewReader reads a view's volumes and the FSM's nodes and plugins (which
// the schedules do not change).
type viewReader struct {
	st      *state.Store
	volumes []*statepb.Volume
}

func (r viewReader) Node(id string) *statepb.ClusterNode { return r.st.Node(id) }
func (r viewReader) ControllerAdvertises(pluginID, capability string) bool {
	return r.st.ControllerAdvertises(pluginID, capability)
}
func (r viewReader) Volumes(pluginID string) []*statepb.Volume {
	return slices.DeleteFunc(slices.Clone(r.volumes), func(v *statepb.Volume) bool { return v.GetPluginId() != pluginID })
}

// command builds one command from a random view: a claim that the view
// admits, or a step or a removal of a claim the view holds.
func (s *schedule) command() *statepb.LogEntry {
	view := s.views[s.rnd.IntN(len(s.views))]
	if s.rnd.IntN(4) == 0 {
		view = s.f.State().Volumes("") // a leader with the current state
	}
	v := view[s.rnd.IntN(len(view))]
	if len(v.GetClaims()) == 0 || s.rnd.IntN(3) == 0 {
		node := propNodes[s.rnd.IntN(len(propNodes))]
		ro := s.rnd.IntN(2) == 0
		c := &statepb.VolumeClaim{
			NodeId: node, CsiNodeId: "csi-" + node, WorkloadId: propWorkloads[s.rnd.IntN(len(propWorkloads))],
			State: rules.StateTaken, ReadOnly: ro,
			Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: s.modes[v.GetId()], ReadOnly: ro},
		}
		// The leader refuses early what its view refuses.
		if rules.CheckTake(viewReader{st: s.f.State(), volumes: view}, v, c) != nil {
			return nil
		}
		return &statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, c)}}
	}
	c := v.GetClaims()[s.rnd.IntN(len(v.GetClaims()))]
	var step *statepb.ClaimStepCommand
	switch s.rnd.IntN(8) {
	case 0:
		step = rules.Mounted(v, c, s.rnd.IntN(2) == 0, map[string]string{"k": "v"}, "/host/"+c.GetWorkloadId(), "/staging")
	case 1:
		step = rules.Published(v, c, map[string]string{"k": "v"})
	case 2:
		step = rules.StartRelease(v, c, rules.ReasonReleased)
	case 3:
		step = rules.Fail(v, c, "step failed")
	case 4:
		step = rules.ReleaseWithoutNode(v, c)
	case 5:
		step = rules.NodeUnpublished(v, c)
	case 6:
		step = rules.ControllerUnpublished(v, c)
	default:
		return &statepb.LogEntry{Command: &statepb.LogEntry_ClaimRemove{ClaimRemove: rules.Remove(v, c)}}
	}
	return &statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: step}}
}

// run applies n random commands and returns the first violation of the
// promise, or "".
func (s *schedule) run(n int) string {
	for range n {
		if e := s.command(); e != nil {
			_ = s.apply(e) // a refused command is fine; the state decides
		}
		if why := s.check(); why != "" {
			return why
		}
		if s.rnd.IntN(3) == 0 {
			s.views = append(s.views, s.f.State().Volumes(""))
		}
	}
	return ""
}

// check returns how the current state breaks the promise, or "".
func (s *schedule) check() string {
	for _, v := range s.f.State().Volumes("") {
		r := accessModeRules[s.modes[v.GetId()]]
		writers, nodes := 0, map[string]bool{}
		keys := map[[2]string]bool{}
		for _, c := range v.GetClaims() {
			if !c.GetReadOnly() {
				writers++
			}
			nodes[c.GetNodeId()] = true
			k := [2]string{c.GetNodeId(), c.GetWorkloadId()}
			if keys[k] {
				return fmt.Sprintf("volume %s: two claims of workload %s on node %s", v.GetId(), k[1], k[0])
			}
			keys[k] = true
			if why := s.reachable(v.GetId(), c); why != "" {
				return why
			}
		}
		switch {
		case r.oneWriter && writers > 1:
			return fmt.Sprintf("volume %s (%s): %d writers: %v", v.GetId(), s.modes[v.GetId()], writers, v.GetClaims())
		case r.readersOnly && writers > 0:
			return fmt.Sprintf("volume %s (%s): a writer: %v", v.GetId(), s.modes[v.GetId()], v.GetClaims())
		case r.oneNode && len(nodes) > 1:
			return fmt.Sprintf("volume %s (%s): claims on %d nodes: %v", v.GetId(), s.modes[v.GetId()], len(nodes), v.GetClaims())
		}
	}
	return ""
}

// reachable returns why claim c is in a state the claim state machine
// cannot reach, or "".
func (s *schedule) reachable(volumeID string, c *statepb.VolumeClaim) string {
	st := c.GetState()
	switch {
	case c.GetClaimIndex() == 0:
		return fmt.Sprintf("volume %s: claim without an index: %v", volumeID, c)
	case st != rules.StateTaken && !rules.Releasing(st):
		return fmt.Sprintf("volume %s: claim in state %q: %v", volumeID, st, c)
	case (st == rules.StateNodeUnpublished || st == rules.StateControllerUnpublished) && c.GetMounted():
		return fmt.Sprintf("volume %s: claim %s but mounted: %v", volumeID, st, c)
	case st == rules.StateControllerUnpublished && c.GetControllerPublished():
		return fmt.Sprintf("volume %s: claim %s but controller published: %v", volumeID, st, c)
	case c.GetMounted() && c.GetHostPath() == "":
		return fmt.Sprintf("volume %s: claim mounted without a host path: %v", volumeID, c)
	case st == rules.StateTaken && c.GetNodeGone():
		return fmt.Sprintf("volume %s: claim taken on a node gone: %v", volumeID, c)
	}
	key := claimKey{volumeID, c.GetClaimIndex()}
	seen := s.seen[key]
	if n := len(seen); n == 0 || seen[n-1] != st {
		if n == 0 && st != rules.StateTaken {
			return fmt.Sprintf("volume %s: claim first seen in state %s: %v", volumeID, st, c)
		}
		if n > 0 && !rules.Legal(seen[n-1], st) {
			return fmt.Sprintf("volume %s: claim went from %s to %s: %v", volumeID, seen[n-1], st, c)
		}
		s.seen[key] = append(seen, st)
	}
	return ""
}

// propertyCommands is the number of commands of one schedule; the number
// of schedules, propertySchedules, is 10,000 with the fault tag and
// fewer in the default run, which the race detector slows.
const propertyCommands = 40

func TestClaimCommandsKeepThePromise(t *testing.T) {
	n := propertySchedules
	if testing.Short() {
		n = 500
	}
	for seed := range uint64(n) {
		s := newSchedule(t, seed, nil)
		if why := s.run(propertyCommands); why != "" {
			t.Fatalf("schedule %d: %s", seed, why)
		}
	}
}

// TestPropertyCatchesAMissingSingleWriterCheck runs the same schedules
// against an FSM whose claim_take check lets a second writer in (it drops
// only the refusals of the one-writer rule): the property must then find
// two writers, or it proves nothing. The leaders still refuse early
// what their views refuse, so only stale commands get a second writer in.
func TestPropertyCatchesAMissingSingleWriterCheck(t *testing.T) {
	withoutSingleWriter := func(st rules.Reader, v *statepb.Volume, c *statepb.VolumeClaim) error {
		err := rules.CheckTake(st, v, c)
		if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); ok &&
			d.GetRule() == csisupdv1.ClaimRuleAccessMode && strings.Contains(d.GetDescription(), "allows one writer") {
			return nil
		}
		return err
	}
	for seed := range uint64(propertySchedules) {
		s := newSchedule(t, seed, withoutSingleWriter)
		why := s.run(propertyCommands)
		if strings.Contains(why, "writers") {
			t.Logf("schedule %d found: %s", seed, why)
			return
		}
		if why != "" {
			t.Fatalf("schedule %d broke another rule than the one removed: %s", seed, why)
		}
	}
	t.Fatalf("%d schedules without the FSM's single-writer check found no second writer", propertySchedules)
}
