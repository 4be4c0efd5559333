package server_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// durabilityFloor samples, beside an operation's benchmark, what the
// operation cannot do without: one raft write through the same leader
// (a no-op entry, encoded, appended, replicated and applied the way a
// volume operation's command is) and one fsync of a small file in the
// agent's data dir (the disk a node's mount records are synced to). Its
// floor of an operation is the direct CSI calls' p50 plus its durable
// writes at these p50s.
type durabilityFloor struct {
	srv   *server.Server
	file  *os.File
	raft  []time.Duration
	fsync []time.Duration
}

// newDurabilityFloor returns the sampler of srv's raft writes, and of
// fsyncs in dir when dir is not empty.
func newDurabilityFloor(b *testing.B, srv *server.Server, dir string) *durabilityFloor {
	b.Helper()
	f := &durabilityFloor{srv: srv}
	if dir != "" {
		file, err := os.CreateTemp(dir, ".bench-fsync-*")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			file.Close()
			os.Remove(file.Name())
		})
		f.file = file
	}
	return f
}

// sample times one raft write and, with a data dir, one fsync.
func (f *durabilityFloor) sample(b *testing.B) {
	b.Helper()
	data, err := fsm.Encode(&statepb.LogEntry{Time: timestamppb.Now(), Command: &statepb.LogEntry_Noop{Noop: []byte("bench")}})
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := f.srv.Raft().Apply(data, 30*time.Second).Error(); err != nil {
		b.Fatalf("raft write of a no-op: %v", err)
	}
	f.raft = append(f.raft, time.Since(start))
	if f.file == nil {
		return
	}
	if _, err := f.file.WriteAt([]byte("a mount record's worth of bytes"), 0); err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	if err := f.file.Sync(); err != nil {
		b.Fatal(err)
	}
	f.fsync = append(f.fsync, time.Since(start))
}

// report reports the p50 of a raft write (raft-write-p50-ms) and of an
// fsync (node-fsync-p50-ms) once, and returns them.
func (f *durabilityFloor) report(b *testing.B) (raftP50, fsyncP50 time.Duration) {
	raftP50 = median(f.raft)
	b.ReportMetric(ms(raftP50), "raft-write-p50-ms")
	if len(f.fsync) > 0 {
		fsyncP50 = median(f.fsync)
		b.ReportMetric(ms(fsyncP50), "node-fsync-p50-ms")
	}
	return raftP50, fsyncP50
}

// reportFloor reports op's floor (<op>-floor-ms): directP50 plus writes
// raft writes at raftP50 and fsyncs node fsyncs at fsyncP50; and how far
// above it op's p50 is (<op>-p50-x-floor).
func reportFloor(b *testing.B, op string, opP50, directP50 time.Duration, writes float64, raftP50 time.Duration, fsyncs float64, fsyncP50 time.Duration) {
	floor := directP50 + time.Duration(writes*float64(raftP50)) + time.Duration(fsyncs*float64(fsyncP50))
	b.ReportMetric(ms(floor), op+"-floor-ms")
	b.ReportMetric(float64(opP50)/float64(floor), op+"-p50-x-floor")
}

// median returns the p50 of d, sorting it.
func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
