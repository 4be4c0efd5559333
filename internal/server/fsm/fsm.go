package fsm

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Encode encodes a log entry for raft.Apply. The FSM decodes the entries
// of the log as statepb.LogEntry, whose wire format is also that of the
// entries written before the storage messages existed.
func Encode(e *statepb.LogEntry) ([]byte, error) {
	data, err := proto.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode log entry: %w", err)
	}
	return data, nil
}

// Result is what the FSM returns for one log entry: the entry's raft
// index and the error that refused it. For a LogBatch, Errs holds one
// error per batched entry.
type Result struct {
	Index uint64
	Err   error
	Errs  []error
}

// FSM applies raft log entries to the state store. It implements
// raft.BatchingFSM so a batch of committed entries is applied in one memdb
// transaction.
type FSM struct {
	mu     sync.RWMutex // guards state replacement on restore
	state  *state.Store
	events *Events
	// scratch holds the events of one entry while they are published; the
	// buffer copies them. Only raft's FSM goroutine uses it.
	scratch []Event
	// onRestore, when set, runs after a restore replaced the state, on
	// raft's FSM goroutine: the leader's heartbeat timers and what it
	// knows of the nodes belong to the state replaced.
	onRestore func()
	// checkTake checks a claim_take command: rules.CheckTake. The
	// property test replaces it to show what the check prevents.
	checkTake func(st rules.Reader, v *statepb.Volume, c *statepb.VolumeClaim) error
}

var _ raft.BatchingFSM = (*FSM)(nil)

// Config configures an FSM.
type Config struct {
	// Events receives the events of each applied entry. Required.
	Events *Events
	// OnRestore, when set, runs after a restore replaced the state, on
	// raft's FSM goroutine.
	OnRestore func()
}

// New returns an FSM over an empty state store.
func New(cfg Config) (*FSM, error) {
	if cfg.Events == nil {
		return nil, errors.New("fsm: Events is required")
	}
	st, err := state.New()
	if err != nil {
		return nil, fmt.Errorf("fsm: %w", err)
	}
	return &FSM{state: st, events: cfg.Events, onRestore: cfg.OnRestore, checkTake: rules.CheckTake}, nil
}

// State returns the current state store.
func (f *FSM) State() *state.Store {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state
}

// Apply applies one log entry; see ApplyBatch.
func (f *FSM) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies committed log entries in one state transaction and
// then publishes their events, one batch per entry at its raft index. Each
// result is a Result; a LogBatch entry's has one error per batched entry.
func (f *FSM) ApplyBatch(logs []*raft.Log) []interface{} {
	f.mu.RLock()
	st := f.state
	f.mu.RUnlock()

	out := make([]interface{}, len(logs))
	var events []*csisupdv1.ClusterEvent
	// ends[i] is the end in events of the events of logs[i].
	ends := make([]int, len(logs))
	txn := st.Write()
	var last uint64
	for i, l := range logs {
		last = l.Index
		ends[i] = len(events)
		if l.Type != raft.LogCommand {
			out[i] = Result{Index: l.Index}
			continue
		}
		var e statepb.LogEntry
		if err := proto.Unmarshal(l.Data, &e); err != nil {
			out[i] = Result{Index: l.Index, Err: fmt.Errorf("decode log entry %d: %w", l.Index, err)}
			continue
		}
		// apply checks before it writes, so a failed entry leaves no
		// partial writes behind.
		if b, ok := e.GetCommand().(*statepb.LogEntry_Batch); ok {
			res := Result{Index: l.Index, Errs: make([]error, len(b.Batch.GetEntries()))}
			for j, sub := range b.Batch.GetEntries() {
				if sub.Time == nil {
					sub.Time = e.GetTime()
				}
				res.Errs[j] = f.apply(txn, l.Index, l.Term, sub, &events)
			}
			out[i] = res
			ends[i] = len(events)
			continue
		}
		out[i] = Result{Index: l.Index, Err: f.apply(txn, l.Index, l.Term, &e, &events)}
		ends[i] = len(events)
	}
	if last > 0 {
		if err := txn.SetLatestIndex(last); err != nil {
			panic(err.Error())
		}
	}
	txn.Commit()
	// Published after the commit, so that a reader that looks at the state
	// on an event finds the write that caused it.
	start := 0
	for i, l := range logs {
		f.scratch = f.scratch[:0]
		for _, e := range events[start:ends[i]] {
			topic, key := Topic(e)
			f.scratch = append(f.scratch, Event{Topic: topic, Key: key, Payload: e})
		}
		start = ends[i]
		f.events.Publish(l.Index, f.scratch...)
	}
	clear(f.scratch) // let the payloads go
	return out
}

// Snapshot captures the state for raft.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{snap: f.State().Snapshot()}, nil
}

// Restore replaces the state with a snapshot's, at an index past every one
// applied, and starts a new event buffer: the events buffered so far do
// not lead up to the restored state.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	snap, err := state.DecodeSnapshot(data)
	if err != nil {
		return err
	}
	// The restore is a write: its index is the snapshot's, but never one
	// already applied, so that indexes handed out never go backwards (a
	// backup restored by an operator is older than the state it replaces).
	// Only raft's FSM goroutine writes the state, so it cannot change
	// between this read and the swap.
	at := max(snap.GetIndex(), f.State().LatestIndex()+1)
	st, err := state.FromSnapshot(snap, at)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = st
	f.mu.Unlock()
	if f.onRestore != nil {
		f.onRestore()
	}
	// The events buffered so far do not lead up to the restored state.
	return f.events.Restore(at)
}

type fsmSnapshot struct {
	snap *statepb.StateSnapshot
}

// Persist writes the snapshot to sink.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	data, err := state.EncodeSnapshot(s.snap)
	if err != nil {
		sink.Cancel()
		return err
	}
	if _, err := sink.Write(data); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

// Release does nothing: the snapshot holds only immutable messages.
func (s *fsmSnapshot) Release() {}
