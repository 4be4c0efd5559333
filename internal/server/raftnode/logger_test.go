package raftnode

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestRaftLoggerFirstElectionIsInfo(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		args []any
		want string // level written
	}{
		{"first election", "heartbeat timeout reached, starting election",
			[]any{"last-leader-addr", raft.ServerAddress(""), "last-leader-id", raft.ServerID("")}, "[INFO]"},
		{"lost leader", "heartbeat timeout reached, starting election",
			[]any{"last-leader-addr", raft.ServerAddress("10.0.0.1:4781"), "last-leader-id", raft.ServerID("s1")}, "[WARN]"},
		{"other warning", "failed to contact", []any{"server-id", "s2"}, "[WARN]"},
		{"no leader key", "heartbeat timeout reached, starting election", nil, "[WARN]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out testutil.SyncBuffer
			l := raftLogger{hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Trace})}
			l.Warn(tt.msg, tt.args...)
			if got := out.String(); !strings.Contains(got, tt.want) {
				t.Errorf("logged %q, want level %s", got, tt.want)
			}
		})
	}
}
