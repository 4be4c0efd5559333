package agent

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/config"
)

// devReadyPoll is how often a dev agent looks whether its node and plugins
// are registered with its own server.
const devReadyPoll = 10 * time.Millisecond

// startGateTimeout bounds how long a call made while the agent starts
// waits for it to be ready.
const startGateTimeout = 15 * time.Second

// waitReady waits until the agent is ready to serve: its first scan of
// the plugin directory is reconciled and, in dev mode, its node and every
// plugin found then are registered with its own server (so the first
// `volume create` finds the demo plugin). It returns false when ctx ended
// first.
func (a *Agent) waitReady(ctx context.Context) bool {
	select {
	case <-a.manager.Ready():
	case <-ctx.Done():
		return false
	}
	if !a.cfg.Dev || a.nodes == nil {
		return true
	}
	deadline := time.NewTimer(config.DefaultDevReadyTimeout)
	defer deadline.Stop()
	poll := time.NewTicker(devReadyPoll)
	defer poll.Stop()
	for !a.devRegistered() {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			a.log.Warn("dev agent: node and plugins not registered with the dev server in time; serving anyway",
				"waited", config.DefaultDevReadyTimeout)
			return true
		case <-poll.C:
		}
	}
	return true
}

// devRegistered reports whether every plugin has been probed once and the
// servers hold the node's plugins as they are now.
func (a *Agent) devRegistered() bool {
	for _, p := range a.manager.Registry().Source().List() {
		if p.GetHealthState() == "unknown" {
			return false
		}
	}
	return a.nodes.Synced()
}

// startGated reports whether method waits for the agent to be ready. The
// cluster-internal services, health and reflection answer at once: the
// dev agent's own node registration goes through Cluster, and a probe
// must see "starting" rather than wait.
func startGated(method string) bool {
	for _, prefix := range []string{"/grpc.health.v1.", "/grpc.reflection.", "/csisupd.v1.Cluster/"} {
		if strings.HasPrefix(method, prefix) {
			return false
		}
	}
	return true
}

// waitStarted holds a call made while the agent starts until it is ready,
// so that `csisupd status` answers only once the agent can serve what
// follows it (a `volume create` on a dev agent, for example).
func (a *Agent) waitStarted(ctx context.Context, method string) error {
	if !startGated(method) {
		return nil
	}
	select {
	case <-a.ready:
		return nil
	default:
	}
	t := time.NewTimer(startGateTimeout)
	defer t.Stop()
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-t.C:
		return status.Errorf(codes.Unavailable, "agent %s is still starting (first plugin scan or dev registration not done after %s)",
			a.name, startGateTimeout)
	}
}

func (a *Agent) startGateUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.waitStarted(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *Agent) startGateStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.waitStarted(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
