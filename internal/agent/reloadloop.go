package agent

import (
	"context"
	"time"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// reloadLoopName names the reload loop to the watchdog: /v1/health lists
// it among its stalled loops while a reload overruns its deadline.
const reloadLoopName = "config reload"

// LoadFunc reads the configuration a reload applies: the configuration
// files, the environment and the flags, as at start.
type LoadFunc func() (*config.Config, error)

// RequestReload asks the agent to reload, as on SIGHUP: its reload loop
// reads a new configuration with load and applies it (Reload), under the
// reload deadline (Config.ReloadTimeout). It never blocks. A request made
// while another waits to run is merged into it: the waiting one reads the
// files when it runs. A reload that overruns its deadline is abandoned
// and reported: the loop is stalled (/v1/health answers 503 naming it, and
// the systemd watchdog pings stop) until the reload ends, and requests
// made meanwhile run after it.
func (a *Agent) RequestReload(load LoadFunc) {
	select {
	case a.reloads <- load:
	default:
		a.log.Info("reload requested while another waits to run; it reads the configuration when it runs")
	}
}

// runReloads is the reload loop: it runs the requested reloads one at a
// time until ctx ends.
func (a *Agent) runReloads(ctx context.Context) error {
	loop := a.watchdog.Loop(reloadLoopName)
	defer loop.Done()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-loop.C():
			loop.Beat()
		case load := <-a.reloads:
			a.superviseReload(ctx, loop, load)
			loop.Beat()
		}
	}
}

// superviseReload runs one reload in a goroutine of its own and waits for
// it. Past the reload deadline it reports the reload as stuck and keeps
// waiting (a second reload beside a stuck one could race it, or be undone
// by it), with the loop stalled. When ctx ends first it waits a quarter of
// ShutdownTimeout, then abandons the reload.
func (a *Agent) superviseReload(ctx context.Context, loop *watchdog.Loop, load LoadFunc) {
	started := time.Now()
	loop.Due(started.Add(a.reloadTimeout))
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.reload(load)
	}()
	deadline := time.NewTimer(a.reloadTimeout)
	defer deadline.Stop()
	select {
	case <-done:
		return
	case <-ctx.Done():
		a.abandonReload(done)
		return
	case <-deadline.C:
	}
	a.log.Error("reload did not finish within its deadline; /v1/health reports the loop stalled and the systemd watchdog is not pinged "+
		"until it ends, and reloads requested meanwhile wait for it", "loop", reloadLoopName, "deadline", a.reloadTimeout)
	select {
	case <-done:
		a.log.Warn("the reload that overran its deadline ended", "loop", reloadLoopName, "took", time.Since(started).Round(time.Millisecond))
	case <-ctx.Done():
		a.abandonReload(done)
	}
}

// abandonReload waits a little for a reload still running while the agent
// stops, and reports it when it does not end.
func (a *Agent) abandonReload(done <-chan struct{}) {
	t := time.NewTimer(ShutdownTimeout / 4)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		a.log.Warn("stopping with a reload still running; it is abandoned", "loop", reloadLoopName)
	}
}

// reload reads a configuration with load and applies it. Every problem is
// logged: a configuration that cannot be read keeps the running one whole,
// and Reload logs what it could not apply itself.
func (a *Agent) reload(load LoadFunc) {
	next, err := load()
	if err != nil {
		a.log.Error("reload failed; keeping the running configuration", "error", err)
		return
	}
	_ = a.Reload(next)
}
