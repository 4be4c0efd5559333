package server

import (
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// fsm applies raft log entries to the state store. It implements
// raft.BatchingFSM so a batch of committed entries is applied in one memdb
// transaction.
type fsm struct {
	mu     sync.RWMutex // guards state replacement on restore
	state  *StateStore
	events *clusterEvents
	// scratch holds the events of one entry while they are published; the
	// buffer copies them. Only raft's FSM goroutine uses it.
	scratch []clusterEvent
	// onRestore, when set, runs after a restore replaced the state, on
	// raft's FSM goroutine: the leader's heartbeat timers and what it
	// knows of the nodes belong to the state replaced.
	onRestore func()
}

var _ raft.BatchingFSM = (*fsm)(nil)

func newFSM(events *clusterEvents) (*fsm, error) {
	st, err := NewStateStore()
	if err != nil {
		return nil, err
	}
	return &fsm{state: st, events: events}, nil
}

// State returns the current state store.
func (f *fsm) State() *StateStore {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state
}

func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	f.mu.RLock()
	st := f.state
	f.mu.RUnlock()

	out := make([]interface{}, len(logs))
	var events []*csisupdv1.ClusterEvent
	// ends[i] is the end in events of the events of logs[i].
	ends := make([]int, len(logs))
	txn := st.db.Txn(true)
	var last uint64
	for i, l := range logs {
		last = l.Index
		ends[i] = len(events)
		if l.Type != raft.LogCommand {
			out[i] = applyResult{Index: l.Index}
			continue
		}
		var e csisupdv1.LogEntry
		if err := proto.Unmarshal(l.Data, &e); err != nil {
			out[i] = applyResult{Index: l.Index, Err: fmt.Errorf("decode log entry %d: %w", l.Index, err)}
			continue
		}
		// applyEntry checks before it writes, so a failed entry leaves no
		// partial writes behind.
		if b, ok := e.GetCommand().(*csisupdv1.LogEntry_Batch); ok {
			res := applyResult{Index: l.Index, Errs: make([]error, len(b.Batch.GetEntries()))}
			for j, sub := range b.Batch.GetEntries() {
				if sub.Time == nil {
					sub.Time = e.GetTime()
				}
				res.Errs[j] = applyEntry(txn, l.Index, sub, &events)
			}
			out[i] = res
			ends[i] = len(events)
			continue
		}
		out[i] = applyResult{Index: l.Index, Err: applyEntry(txn, l.Index, &e, &events)}
		ends[i] = len(events)
	}
	if last > 0 {
		if err := txn.Insert(tableIndex, &indexRow{Key: "latest", Value: last}); err != nil {
			panic(fmt.Sprintf("write state index: %v", err))
		}
	}
	txn.Commit()
	// Published after the commit, so that a reader that looks at the state
	// on an event finds the write that caused it.
	start := 0
	for i, l := range logs {
		f.scratch = f.scratch[:0]
		for _, e := range events[start:ends[i]] {
			topic, key := eventTopic(e)
			f.scratch = append(f.scratch, clusterEvent{Topic: topic, Key: key, Payload: e})
		}
		start = ends[i]
		f.events.publish(l.Index, f.scratch...)
	}
	clear(f.scratch) // let the payloads go
	return out
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{snap: f.State().snapshot()}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	var snap csisupdv1.StateSnapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("decode snapshot: %w", err)
	}
	st, err := NewStateStore()
	if err != nil {
		return err
	}
	// The restore is a write: its index is the snapshot's, but never one
	// already applied, so that indexes handed out never go backwards (a
	// backup restored by an operator is older than the state it replaces).
	// Only raft's FSM goroutine writes the state, so it cannot change
	// between this read and the swap.
	at := max(snap.GetIndex(), f.State().LatestIndex()+1)
	if err := st.restore(&snap, at); err != nil {
		return err
	}
	f.mu.Lock()
	f.state = st
	f.mu.Unlock()
	if f.onRestore != nil {
		f.onRestore()
	}
	// The events buffered so far do not lead up to the restored state.
	return f.events.restore(at)
}

type fsmSnapshot struct {
	snap *csisupdv1.StateSnapshot
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	data, err := proto.Marshal(s.snap)
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("encode snapshot: %w", err)
	}
	if _, err := sink.Write(data); err != nil {
		sink.Cancel()
		return fmt.Errorf("write snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
