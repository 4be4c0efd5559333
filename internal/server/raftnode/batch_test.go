package raftnode

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestStampBatch checks which entries ApplyBatched gives a time: the
// entries of a LogBatch (grouped, they sit two levels down, where the FSM
// hands no time), never a plain entry (it takes the group's).
func TestStampBatch(t *testing.T) {
	at := timestamppb.New(timestamppb.Now().AsTime().Add(-3600e9))
	own := timestamppb.New(at.AsTime().Add(-60e9))
	noop := func(ts *timestamppb.Timestamp) *statepb.LogEntry {
		return &statepb.LogEntry{Time: ts, Command: &statepb.LogEntry_Noop{Noop: []byte("x")}}
	}
	batch := func(ts *timestamppb.Timestamp, subs ...*statepb.LogEntry) *statepb.LogEntry {
		return &statepb.LogEntry{Time: ts, Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{Entries: subs}}}
	}

	plain := noop(nil)
	stampBatch(plain)
	if plain.Time != nil {
		t.Errorf("plain entry got time %v, want none", plain.Time)
	}

	timed := batch(at, noop(nil), noop(own))
	stampBatch(timed)
	if got := timed.GetBatch().GetEntries(); !got[0].GetTime().AsTime().Equal(at.AsTime()) || !got[1].GetTime().AsTime().Equal(own.AsTime()) {
		t.Errorf("entries of a batch with a time got %v, %v; want the batch's %v and their own %v", got[0].GetTime(), got[1].GetTime(), at, own)
	}

	untimed := batch(nil, noop(nil), noop(nil))
	stampBatch(untimed)
	got := untimed.GetBatch().GetEntries()
	if got[0].GetTime() == nil || got[1].GetTime() == nil || !got[0].GetTime().AsTime().Equal(got[1].GetTime().AsTime()) {
		t.Errorf("entries of a batch without a time got %v, %v; want one time now for both", got[0].GetTime(), got[1].GetTime())
	}
}
