package raftnode

import (
	"fmt"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

const (
	// maxBatch is the most writes grouped into one raft entry.
	maxBatch = 512
	// batchesInFlight is how many batch entries may wait for commit at
	// once; requests arriving meanwhile form the next batch.
	batchesInFlight = 1
)

// batchReq is one write waiting to be grouped.
type batchReq struct {
	entry *statepb.LogEntry
	done  chan batchOutcome
}

type batchOutcome struct {
	index uint64
	err   error
}

// ApplyBatched writes one entry through raft, grouped with other
// concurrent writes into a single log entry (group commit), and returns
// once it is committed and applied, with its index and the FSM's error;
// for a LogBatch, the first error of its entries. The entries of a
// LogBatch carry their time before it is grouped: the FSM gives the time
// of the entry that holds them only to the entries one level down, and
// grouped they are two. A plain entry gets the group's time, so that the
// many small writes grouped (plugin updates, heartbeats' status changes)
// carry no time of their own.
func (n *Node) ApplyBatched(e *statepb.LogEntry) (uint64, error) {
	stampBatch(e)
	req := batchReq{entry: e, done: make(chan batchOutcome, 1)}
	select {
	case n.batchCh <- req:
	case <-n.stopCh:
		return 0, fmt.Errorf("raft apply: %w", raft.ErrRaftShutdown)
	}
	out := <-req.done
	return out.index, out.err
}

// stampBatch gives the entries of a LogBatch e that have no time e's
// time, or the time now when e has none either. Other entries are left.
func stampBatch(e *statepb.LogEntry) {
	b := e.GetBatch()
	if b == nil {
		return
	}
	now := e.GetTime()
	if now == nil {
		now = timestamppb.Now()
	}
	for _, sub := range b.GetEntries() {
		if sub.Time == nil {
			sub.Time = now
		}
	}
}

// runBatcher groups writes until shutdown.
func (n *Node) runBatcher() {
	loop := n.cfg.Watchdog.Loop("server batcher")
	defer loop.Done()
	slots := make(chan struct{}, batchesInFlight)
	for {
		// A slot frees when a batch in flight is answered, which raft
		// bounds: it commits, or fails when leadership is lost.
		for waiting := true; waiting; {
			loop.Beat()
			select {
			case slots <- struct{}{}:
				waiting = false
			case <-loop.C():
			case <-n.stopCh:
				return
			}
		}
		var batch []batchReq
		for len(batch) == 0 {
			loop.Beat()
			select {
			case r := <-n.batchCh:
				batch = append(batch, r)
			case <-loop.C():
			case <-n.stopCh:
				return
			}
		}
	collect:
		for len(batch) < maxBatch {
			select {
			case r := <-n.batchCh:
				batch = append(batch, r)
			default:
				break collect
			}
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer func() { <-slots }()
			n.applyGroup(batch)
		}()
	}
}

func (n *Node) applyGroup(batch []batchReq) {
	if len(batch) == 1 {
		idx, err := n.Apply(batch[0].entry)
		batch[0].done <- batchOutcome{index: idx, err: err}
		return
	}
	entries := make([]*statepb.LogEntry, len(batch))
	for i, r := range batch {
		entries[i] = r.entry
	}
	res, err := n.ApplyRaw(&statepb.LogEntry{Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{Entries: entries}}})
	for i, r := range batch {
		out := batchOutcome{index: res.Index, err: err}
		if err == nil && i < len(res.Errs) {
			out.err = res.Errs[i]
		}
		r.done <- out
	}
}
