package server

import (
	"context"
	"time"

	"github.com/hashicorp/raft"

	"github.com/csisupd/csisupd/internal/watchdog"
)

// The leadership monitor and the leader loop: the duties of each term
// this server leads.

// monitorLeadership runs the leader loop for each term this server
// leads, and while it does not lead, keeps the volume watcher's
// observations current, until the server shuts down.
func (s *Server) monitorLeadership() {
	loop := s.cfg.Watchdog.Loop("server leadership monitor")
	defer loop.Done()
	type run struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cur *run
	stop := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer stop()
	// A follower's watcher keeps its observations current, so that the
	// grace periods go on counting if this server takes over.
	observe := time.NewTicker(s.cfg.VolumeWatchInterval)
	defer observe.Stop()
	for {
		loop.Beat()
		select {
		case <-loop.C():
		case <-observe.C:
			if cur == nil {
				s.watcher.Observe(time.Now())
			}
		case isLeader := <-s.node.LeaderCh():
			if isLeader && cur == nil {
				ctx, cancel := context.WithCancel(context.Background())
				cur = &run{cancel: cancel, done: make(chan struct{})}
				go func(done chan struct{}) {
					defer close(done)
					s.leaderLoop(ctx)
				}(cur.done)
			} else if !isLeader {
				stop()
			}
		case <-s.shutdownCh:
			return
		}
	}
}

// leaderLoop runs the leader's duties until ctx ends: make the state
// current, record this server, start heartbeat timers, autopilot, the
// volume watcher and the volume health monitor.
func (s *Server) leaderLoop(ctx context.Context) {
	s.logger.Info("cluster leadership acquired")
	defer s.logger.Info("cluster leadership lost")
	// Registered for this term only; Done runs after the teardown below,
	// so a teardown that hangs is seen.
	loop := s.cfg.Watchdog.Loop("server leader loop")
	defer loop.Done()
	retries := s.cfg.Join.NewBackOff()
	for {
		loop.Busy(time.Now().Add(s.cfg.ApplyTimeout))
		if err := s.node.RaftOp(func() raft.Future { return s.node.Raft().Barrier(s.cfg.ApplyTimeout) }); err == nil {
			break
		} else {
			s.logger.Warn("leader barrier failed", "error", err)
		}
		if waitBeating(ctx, loop, retries.NextBackOff()) != nil {
			return
		}
	}
	loop.Busy(time.Now().Add(s.cfg.ApplyTimeout))
	if err := s.node.RecordSelf(); err != nil {
		s.logger.Warn("record own server address", "error", err)
	}
	s.node.MarkBootstrapped()
	s.heartbeats.Initialize()
	s.leases.Initialize(ctx)
	s.leaderReady.Store(true)
	s.node.StartAutopilot(ctx)
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		s.watcher.Run(ctx)
	}()
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		s.runHealthMonitor(ctx)
	}()

	for ctx.Err() == nil {
		loop.Beat()
		select {
		case <-ctx.Done():
		case <-loop.C():
		}
	}
	s.leaderReady.Store(false)
	s.heartbeats.Clear()
	s.leases.Clear()
	<-s.node.StopAutopilot()
	<-watcherDone
	<-healthDone
}

// waitBeating waits for d like retry.Wait, beating loop meanwhile.
func waitBeating(ctx context.Context, loop *watchdog.Loop, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		loop.Beat()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-loop.C():
		}
	}
}

// runHealthMonitor asks the plugins' controllers for the health of their
// volumes every VolumeHealthInterval until ctx ends (leadership ends).
// It writes through raft only what changed, so that a steady state costs
// the cluster nothing but the listings.
func (s *Server) runHealthMonitor(ctx context.Context) {
	if s.cfg.VolumeHealthInterval <= 0 {
		return
	}
	loop := s.cfg.Watchdog.Loop("volume health monitor")
	defer loop.Done()
	for {
		s.ops.PollControllerHealth(ctx, loop)
		if loop.Wait(ctx, s.cfg.VolumeHealthInterval) != nil {
			return
		}
	}
}
