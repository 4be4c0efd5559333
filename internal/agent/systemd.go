package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"

	"github.com/csisupd/csisupd/internal/watchdog"
)

// statusInterval is how often the one-line STATUS= summary is refreshed
// for `systemctl status` (only sent when it changed).
const statusInterval = 2 * time.Second

// setupWatchdog creates the liveness monitor of the agent's loops. Under a
// systemd watchdog (WATCHDOG_USEC for this process) its part pings systemd
// every third of its timeout while every loop beats; without one the
// monitor only tracks them (for /v1/health and the metrics), with
// watchdog.DefaultTimeout.
func (a *Agent) setupWatchdog() (*watchdog.Monitor, part, error) {
	cfg := watchdog.Config{Timeout: watchdog.DefaultTimeout, Metrics: a.registerer(), Logger: a.log.Named("watchdog")}
	timeout, err := daemon.SdWatchdogEnabled(false)
	switch {
	case err != nil:
		a.log.Warn("systemd watchdog settings are invalid; not pinging the watchdog", "error", err)
	case timeout > 0:
		cfg.Timeout = timeout
		cfg.Notify = func(state string) error {
			_, err := daemon.SdNotify(false, state)
			return err
		}
		a.log.Debug("systemd watchdog enabled", "interval", timeout)
	}
	m, err := watchdog.New(cfg)
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: %w", err)
	}
	return m, part{name: "watchdog", run: func(ctx context.Context) error { m.Run(ctx); return nil }}, nil
}

// underSystemd reports whether systemd asked for notifications.
func underSystemd() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

// notify tells systemd about a state change when running under it.
func (a *Agent) notify(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		a.log.Debug("sd_notify failed", "error", err)
	}
}

// notifyReloading marks the start of a reload; systemd waits for the next
// READY=1. MONOTONIC_USEC lets systemd (Type=notify-reload) match the two.
func (a *Agent) notifyReloading() {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	a.notify(fmt.Sprintf("%s\nMONOTONIC_USEC=%d", daemon.SdNotifyReloading, ts.Nano()/1000))
}

// statusLine is the STATUS= summary: "3 plugins, 3 healthy; leader n1".
func (a *Agent) statusLine() string {
	total, healthy := a.pluginCounts()
	line := fmt.Sprintf("%d plugins, %d healthy", total, healthy)
	switch {
	case a.server != nil:
		if leader := a.leaderName(); leader != "" {
			line += "; leader " + leader
		} else {
			line += "; no cluster leader"
		}
	case a.nodes != nil:
		if a.nodes.Registered() {
			line += "; node registered"
		} else {
			line += "; node not registered"
		}
	}
	if stale := a.watchdog.Stale(); len(stale) > 0 {
		line += fmt.Sprintf("; stalled: %v", stale)
	}
	return line
}

// leaderName is the name of the cluster leader as this server knows it,
// else its id; "" when there is none.
func (a *Agent) leaderName() string {
	id := a.server.Leader()
	if id == "" {
		return ""
	}
	if n := a.server.State().Node(id); n != nil && n.GetName() != "" {
		return n.GetName()
	}
	return id
}

// runSystemdStatus tells systemd READY=1 once the agent is ready, with a
// first STATUS= line, then keeps that line current until ctx ends.
func (a *Agent) runSystemdStatus(ctx context.Context) {
	if !underSystemd() {
		return
	}
	select {
	case <-a.ready:
	case <-ctx.Done():
		return
	}
	last := a.statusLine()
	a.notify(daemon.SdNotifyReady + "\nSTATUS=" + last)
	t := time.NewTicker(statusInterval)
	defer t.Stop()
	for {
		if line := a.statusLine(); line != last {
			a.notify("STATUS=" + line)
			last = line
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
