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
			l := newRaftLogger(hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Trace}), hclog.NoLevel)
			l.Warn(tt.msg, tt.args...)
			if got := out.String(); !strings.Contains(got, tt.want) {
				t.Errorf("logged %q, want level %s", got, tt.want)
			}
		})
	}
}

// A floor drops raft's lines below it, through the sub-loggers raft makes
// too, and leaves the rest to the logger's own level.
func TestRaftLoggerFloor(t *testing.T) {
	tests := []struct {
		name   string
		min    hclog.Level
		level  hclog.Level // the wrapped logger's
		log    func(l hclog.Logger)
		want   string // a line that must be written; "" for none
		isInfo bool
	}{
		{"info below warn", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Info("entering leader state") }, "", false},
		{"debug below warn", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Debug("appended") }, "", false},
		{"warn at warn", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Warn("failed to contact") }, "[WARN]  failed to contact", false},
		{"error above warn", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Error("failed to appendEntries") }, "[ERROR] failed to appendEntries", false},
		{"first election is info, dropped", hclog.Warn, hclog.Trace, func(l hclog.Logger) {
			l.Warn("heartbeat timeout reached, starting election", "last-leader-addr", raft.ServerAddress(""))
		}, "", false},
		{"Log below warn", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Log(hclog.Info, "snapshot") }, "", false},
		{"With keeps the floor", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.With("id", "1").Info("creating new snapshot") }, "", false},
		{"Named keeps the floor", hclog.Warn, hclog.Trace, func(l hclog.Logger) { l.Named("x").Info("starting") }, "", false},
		{"no floor", hclog.NoLevel, hclog.Trace, func(l hclog.Logger) { l.Info("entering leader state") }, "[INFO]  entering leader state", true},
		{"logger level still applies", hclog.Debug, hclog.Warn, func(l hclog.Logger) { l.Info("entering leader state") }, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out testutil.SyncBuffer
			l := newRaftLogger(hclog.New(&hclog.LoggerOptions{Output: &out, Level: tt.level}), tt.min)
			tt.log(l)
			got := out.String()
			if tt.want == "" && got != "" {
				t.Errorf("logged %q, want nothing", got)
			}
			if tt.want != "" && !strings.Contains(got, tt.want) {
				t.Errorf("logged %q, want %q", got, tt.want)
			}
			if l.IsInfo() != tt.isInfo {
				t.Errorf("IsInfo() = %v, want %v", l.IsInfo(), tt.isInfo)
			}
		})
	}
}
