package raftnode

import (
	"fmt"

	"github.com/hashicorp/go-hclog"
)

// raftLogger is raft's logger with one message put in its place: the
// "heartbeat timeout reached, starting election" warning of a server that
// has never known a leader. That is how every new cluster elects its first
// leader (and how a one-server cluster starts), so it is logged at info;
// the same timeout after a leader was known is a lost leader and stays a
// warning.
type raftLogger struct {
	hclog.Logger
}

func (l raftLogger) Warn(msg string, args ...any) {
	if msg == "heartbeat timeout reached, starting election" && firstElection(args) {
		l.Logger.Info("no leader yet, starting the first election", args...)
		return
	}
	l.Logger.Warn(msg, args...)
}

// firstElection reports whether raft's key/value args name no last
// leader.
func firstElection(args []any) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == "last-leader-addr" {
			// raft passes a raft.ServerAddress.
			return fmt.Sprint(args[i+1]) == ""
		}
	}
	return false
}
