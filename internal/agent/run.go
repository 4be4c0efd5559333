package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/csisupd/csisupd/internal/config"
)

// Run serves until ctx ends, then stops gracefully. It returns the first
// error of a component that failed on its own.
//
// It starts in order, and stops in reverse: the gRPC and HTTP servers, the
// server role, then the parts New set up (the registry, the Consul sync,
// the node client, the node volumes, the watchdog, ...). The parts stop
// together when ctx ends, each within its own bound; the server role and
// then the listeners stop after them, so Consul deregistration and the
// last registry write happen while the agent still answers.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.ran {
		a.mu.Unlock()
		return errors.New("agent: Run called twice or after Close")
	}
	a.ran = true
	a.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(a.parts)+5)
	listeners := &group{errs: errs, cancel: cancel}
	workers := &group{errs: errs, cancel: cancel}

	listeners.start("grpc server", a.serveGRPC)
	listeners.start("http server", a.serveHTTP)
	if a.server != nil {
		// A server role that fails to start stops the agent; the parts
		// still start, on an ended context, and stop at once as they do.
		if err := a.server.Start(ctx); err != nil {
			cancel()
			errs <- fmt.Errorf("server role: %w", err)
		}
	}
	for _, p := range a.parts {
		if p.run != nil {
			workers.start(p.name, func() error { return p.run(ctx) })
		}
	}
	if a.waitReady(ctx) {
		// Logged before Ready closes, so whoever waits on Ready sees the line
		// in the log, not in a monitor it attaches afterwards.
		a.log.Info("agent serving", "name", a.name, "rpc", a.RPCAddr().String(),
			"http", a.HTTPAddr().String(), "plugin_dir", a.pluginDir, "data_dir", a.dataDir)
		if a.cfg.Dev {
			a.log.Info(devReadyLine(a.RPCAddr().String()))
		}
		a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		close(a.ready)
	}

	<-ctx.Done()
	a.notify(daemon.SdNotifyStopping)
	a.log.Info("agent stopping")
	a.health.Shutdown()
	workers.wg.Wait() // registry persisted, Consul deregistered, node client stopped
	if a.server != nil {
		sctx, scancel := context.WithTimeout(context.Background(), ShutdownTimeout/2)
		if err := a.server.Shutdown(sctx); err != nil {
			errs <- fmt.Errorf("server role: %w", err)
		}
		scancel()
	}
	a.stopServers()
	listeners.wg.Wait()
	if a.volumes != nil {
		// No call is served any more: the records' journal is closed.
		if err := a.volumes.Close(); err != nil {
			errs <- err
		}
	}
	if a.tempDir != "" {
		_ = os.RemoveAll(a.tempDir)
	}
	close(errs)
	return a.stopped(errs)
}

// devReadyLine is what a dev agent logs once it is ready: the first
// command to try, with --address when the agent does not listen where the
// CLI looks by default.
func devReadyLine(rpcAddr string) string {
	cmd := "csisupd status"
	if rpcAddr != net.JoinHostPort(config.DefaultBindAddr, strconv.Itoa(config.DefaultRPCPort)) {
		cmd = "csisupd --address " + rpcAddr + " status"
	}
	return fmt.Sprintf("csisupd is ready: try %q", cmd)
}

// group runs functions of Run, each in a goroutine; one that fails sends
// its error, named, and cancels Run's context.
type group struct {
	wg     sync.WaitGroup
	errs   chan<- error
	cancel context.CancelFunc
}

func (g *group) start(name string, f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.errs <- fmt.Errorf("%s: %w", name, err)
			g.cancel()
		}
	})
}

// serveGRPC serves the gRPC APIs until stopServers.
func (a *Agent) serveGRPC() error {
	if err := a.grpc.Serve(a.rpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// serveHTTP serves the HTTP endpoints until stopServers.
func (a *Agent) serveHTTP() error {
	if err := a.http.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// stopped logs the end of Run and returns the errors of errs, closed,
// joined.
func (a *Agent) stopped(errs <-chan error) error {
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		a.log.Error("agent stopped with errors", "error", err)
		return err
	}
	a.log.Info("agent stopped")
	return nil
}

// stopServers stops the gRPC and HTTP servers, gracefully first.
func (a *Agent) stopServers() {
	a.stopOnce.Do(func() {
		done := make(chan struct{})
		go func() {
			a.grpc.GracefulStop()
			close(done)
		}()
		timer := time.NewTimer(ShutdownTimeout / 2)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			a.grpc.Stop() // long streams such as WatchEvents end here
			<-done
		}
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout/2)
		defer cancel()
		_ = a.http.Shutdown(sctx)
	})
}
