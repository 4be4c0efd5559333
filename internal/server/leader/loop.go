package leader

import (
	"context"
	"time"

	"github.com/csisupd/csisupd/internal/watchdog"
)

// loopBeat is the context key of the watchdog loop that a long chain of
// calls made for a loop beats between calls (Beat).
type loopBeat struct{}

// WithLoop returns ctx carrying l, so the calls made with it beat l
// between steps. The volume watcher uses it: one release makes several
// calls to agents, each bounded by RPCTimeout, and may take longer in all
// than the watchdog timeout without being stuck.
func WithLoop(ctx context.Context, l *watchdog.Loop) context.Context {
	return context.WithValue(ctx, loopBeat{}, l)
}

// Busy tells the loop ctx carries, if any, that it is in a call bounded
// by deadline (watchdog.Loop.Busy): it is not wedged until then. Requests
// carry none.
func Busy(ctx context.Context, deadline time.Time) {
	if l, ok := ctx.Value(loopBeat{}).(*watchdog.Loop); ok {
		l.Busy(deadline)
	}
}

// BusyWith is Busy until call's deadline, for a call made with call, a
// context derived from ctx with a deadline.
func BusyWith(ctx, call context.Context) {
	if d, ok := call.Deadline(); ok {
		Busy(ctx, d)
	}
}

// Beat beats the loop ctx carries, if any. Requests carry none.
func Beat(ctx context.Context) {
	if l, ok := ctx.Value(loopBeat{}).(*watchdog.Loop); ok {
		l.Beat()
	}
}
