package leader

import (
	"context"

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

// Beat beats the loop ctx carries, if any. Requests carry none.
func Beat(ctx context.Context) {
	if l, ok := ctx.Value(loopBeat{}).(*watchdog.Loop); ok {
		l.Beat()
	}
}
