package raftnode

import (
	"fmt"

	"github.com/hashicorp/go-hclog"
)

// raftLogger is the logger of the raft library (its core, transport and
// snapshot store) with two changes.
//
// Lines below min are dropped, so that raft's own lines can be held to a
// level of their own (Config.RaftLogLevel) while the server's follow the
// agent's. NoLevel drops nothing: the wrapped logger's level decides.
//
// One message is put in its place: the "heartbeat timeout reached,
// starting election" warning of a server that has never known a leader.
// That is how every new cluster elects its first leader (and how a
// one-server cluster starts), so it is logged at info; the same timeout
// after a leader was known is a lost leader and stays a warning.
type raftLogger struct {
	hclog.Logger
	min hclog.Level
}

// newRaftLogger returns l for the raft library, dropping lines below min
// (NoLevel: none).
func newRaftLogger(l hclog.Logger, min hclog.Level) raftLogger {
	return raftLogger{Logger: l, min: min}
}

// drops reports whether a line at level is below the floor.
func (l raftLogger) drops(level hclog.Level) bool {
	return l.min != hclog.NoLevel && level < l.min
}

// Log writes msg at level unless it is below the floor.
func (l raftLogger) Log(level hclog.Level, msg string, args ...any) {
	if !l.drops(level) {
		l.Logger.Log(level, msg, args...)
	}
}

// Trace writes msg at trace level unless it is below the floor.
func (l raftLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }

// Debug writes msg at debug level unless it is below the floor.
func (l raftLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }

// Info writes msg at info level unless it is below the floor.
func (l raftLogger) Info(msg string, args ...any) { l.Log(hclog.Info, msg, args...) }

// Warn writes msg at warn level, and raft's first election at info.
func (l raftLogger) Warn(msg string, args ...any) {
	if msg == "heartbeat timeout reached, starting election" && firstElection(args) {
		l.Info("no leader yet, starting the first election", args...)
		return
	}
	l.Log(hclog.Warn, msg, args...)
}

// Error writes msg at error level unless it is below the floor.
func (l raftLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

// IsTrace reports whether trace lines are written.
func (l raftLogger) IsTrace() bool { return !l.drops(hclog.Trace) && l.Logger.IsTrace() }

// IsDebug reports whether debug lines are written.
func (l raftLogger) IsDebug() bool { return !l.drops(hclog.Debug) && l.Logger.IsDebug() }

// IsInfo reports whether info lines are written.
func (l raftLogger) IsInfo() bool { return !l.drops(hclog.Info) && l.Logger.IsInfo() }

// IsWarn reports whether warnings are written.
func (l raftLogger) IsWarn() bool { return !l.drops(hclog.Warn) && l.Logger.IsWarn() }

// With returns a sub-logger with args that keeps the floor (raft's
// snapshot lines come through it).
func (l raftLogger) With(args ...any) hclog.Logger {
	return raftLogger{Logger: l.Logger.With(args...), min: l.min}
}

// Named returns a named sub-logger that keeps the floor.
func (l raftLogger) Named(name string) hclog.Logger {
	return raftLogger{Logger: l.Logger.Named(name), min: l.min}
}

// ResetNamed returns a sub-logger named name that keeps the floor.
func (l raftLogger) ResetNamed(name string) hclog.Logger {
	return raftLogger{Logger: l.Logger.ResetNamed(name), min: l.min}
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
