package consulsync

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// serverWatch holds what the Syncer's one watch of the servers' catalog
// service last saw, for Servers.
type serverWatch struct {
	wanted   chan struct{} // closed by the first Servers call
	wantOnce sync.Once
	restart  chan struct{} // Reload: ask again with the new configuration

	mu      sync.Mutex
	service string   // the catalog service the fields below are of
	addrs   []string // the latest answer
	have    bool     // addrs is an answer
	err     error    // the last request's error, until one succeeds
	settled chan struct{}
}

func newServerWatch(service string) *serverWatch {
	return &serverWatch{
		wanted:  make(chan struct{}),
		restart: make(chan struct{}, 1),
		service: service,
		settled: make(chan struct{}),
	}
}

// setService forgets what was seen when the watched service changes.
func (w *serverWatch) setService(service string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if service == w.service {
		return
	}
	w.service, w.addrs, w.have, w.err = service, nil, false, nil
	w.settled = make(chan struct{})
}

// record stores the outcome of a request of service: the list on success,
// else the error, which replaces no list. An outcome for a service no
// longer watched is dropped.
func (w *serverWatch) record(service string, addrs []string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if service != w.service {
		return
	}
	if err == nil {
		w.addrs, w.have = addrs, true
	}
	w.err = err
	select {
	case <-w.settled:
	default:
		close(w.settled)
	}
}

// latest returns what Servers answers now; done is false until the watch
// has an answer or an error, and settled is closed when it has.
func (w *serverWatch) latest() (addrs []string, done bool, settled <-chan struct{}, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.have:
		return slices.Clone(w.addrs), true, w.settled, nil
	case w.err != nil:
		return nil, true, w.settled, w.err
	}
	return nil, false, w.settled, nil
}

// Servers returns the gRPC addresses (host:port) of the servers registered
// in Consul's catalog under ServerServiceName, sorted and without
// duplicates: the service address, or the node's address when the service
// has none, with the service port. It makes no request of its own: it
// returns the latest answer of the Syncer's one watch of the catalog
// service, which Run keeps up to date through blocking queries (see the
// package documentation). The first call starts the watch's requests and
// waits, bounded by ctx, for their first outcome; later calls return at
// once. The latest list is returned even while later requests fail;
// before any list, the last request's error.
func (s *Syncer) Servers(ctx context.Context) ([]string, error) {
	w := s.servers
	w.wantOnce.Do(func() { close(w.wanted) })
	for {
		addrs, done, settled, err := w.latest()
		if done {
			return addrs, err
		}
		select {
		case <-settled:
		case <-ctx.Done():
			cfg, _ := s.current()
			return nil, fmt.Errorf("consulsync: waiting for the servers (catalog service %q): %w", cfg.ServerServiceName, ctx.Err())
		}
	}
}

// serversAnswer is the outcome of one catalog request.
type serversAnswer struct {
	addrs []string
	index uint64
	err   error
}

// watchEvent is how a wait or a request of the watch ended.
type watchEvent int

const (
	watchOn      watchEvent = iota // it ran its course
	watchStop                      // ctx ended
	watchRestart                   // Reload: start again with the new configuration
)

// serverWatcher is the state of the watch's goroutine.
type serverWatcher struct {
	s    *Syncer
	loop *watchdog.Loop

	index    uint64    // X-Consul-Index of the last answer; 0 asks at once
	started  time.Time // when the last request started
	failures int
	policy   retry.Policy
	retries  *retry.BackOff
	failLog  repeatLog
}

// watchServers runs the watch until ctx ends: idle until Servers is first
// called, then one blocking query of the catalog service at a time, with
// the index of the previous answer and DiscoveryWait, at most one request
// per DiscoveryMinInterval, and Retry's jittered backoff after a failure.
// Reload restarts it with the new configuration and index 0. Its loop
// "consul server watch" beats while idle, while a request is out and
// while it waits.
func (s *Syncer) watchServers(ctx context.Context) {
	w := &serverWatcher{s: s, loop: s.watchdog.Loop("consul server watch")}
	defer w.loop.Done()
	for wanted := false; !wanted; {
		w.loop.Beat()
		select {
		case <-ctx.Done():
			return
		case <-w.loop.C():
		case <-s.servers.wanted:
			wanted = true
		}
	}
	select { // a Reload before the first request changes nothing
	case <-s.servers.restart:
	default:
	}
	for {
		cfg, cc := s.current()
		if cfg.Retry != w.policy {
			w.policy, w.retries = cfg.Retry, cfg.Retry.NewBackOff()
		}
		ev := w.sleep(ctx, cfg.DiscoveryMinInterval-time.Since(w.started))
		if ev == watchOn {
			w.started = time.Now()
			var ans serversAnswer
			ans, ev = w.request(ctx, cfg, cc)
			if ev == watchOn {
				ev = w.sleep(ctx, w.answer(cfg, ans))
			}
		}
		switch ev {
		case watchStop:
			return
		case watchRestart:
			w.index, w.started, w.failures = 0, time.Time{}, 0
			w.retries.Reset()
		}
	}
}

// sleep waits d (nothing when d is not positive), beating the loop.
func (w *serverWatcher) sleep(ctx context.Context, d time.Duration) watchEvent {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	for {
		w.loop.Beat()
		select {
		case <-ctx.Done():
			return watchStop
		case <-w.s.servers.restart:
			return watchRestart
		case <-t.C:
			return watchOn
		case <-w.loop.C():
		}
	}
}

// request runs one catalog request, bounded by DiscoveryWait, Consul's
// stagger and RequestTimeout, and beats the loop until it returns. A
// Reload cancels it.
func (w *serverWatcher) request(ctx context.Context, cfg Config, cc *consulClient) (serversAnswer, watchEvent) {
	rctx, cancel := context.WithTimeout(ctx, cfg.DiscoveryWait+cfg.DiscoveryWait/16+cfg.RequestTimeout)
	defer cancel()
	done := make(chan serversAnswer, 1)
	go func() { done <- catalogServers(rctx, cfg, cc, w.index) }()
	ev := watchOn
	stop, restart := ctx.Done(), w.s.servers.restart
	for {
		w.loop.Beat()
		select {
		case ans := <-done:
			return ans, ev
		case <-w.loop.C():
		case <-stop:
			ev, stop, restart = watchStop, nil, nil
		case <-restart:
			ev, restart = watchRestart, nil
			cancel()
		}
	}
}

// answer records an answer and returns how long to wait before the next
// request: the backoff after a failure, else nothing. The index follows
// Consul's advice on blocking queries: an index that went backwards (a
// Consul restored or replaced) or is 0 starts again from 0, which asks
// without blocking.
func (w *serverWatcher) answer(cfg Config, ans serversAnswer) time.Duration {
	log := w.s.log
	w.s.servers.record(cfg.ServerServiceName, ans.addrs, ans.err)
	if ans.err != nil {
		w.failures++
		wait := w.retries.NextBackOff()
		args := []any{"error", ans.err, "failed_requests", w.failures, "retry_in", wait}
		if w.failLog.fresh(ans.err.Error(), w.s.now()) {
			log.Warn("consul server watch failed; will retry", args...)
		} else {
			log.Debug("consul server watch still failing", args...)
		}
		return wait
	}
	if w.failures > 0 {
		log.Info("consul server watch recovered", "failed_requests", w.failures)
		w.failLog = repeatLog{}
	}
	w.failures = 0
	w.retries.Reset()
	if ans.index == 0 || ans.index < w.index {
		log.Debug("consul server watch: index reset", "index", ans.index, "previous", w.index)
		ans.index = 0
	}
	w.index = ans.index
	return 0
}

// catalogServers reads the servers' catalog service once: a blocking
// query from index with DiscoveryWait, or at once for index 0.
func catalogServers(ctx context.Context, cfg Config, cc *consulClient, index uint64) serversAnswer {
	q := &api.QueryOptions{}
	if index > 0 {
		q.WaitIndex, q.WaitTime = index, cfg.DiscoveryWait
	}
	entries, meta, err := cc.api.Catalog().Service(cfg.ServerServiceName, "", q.WithContext(ctx))
	if err != nil {
		return serversAnswer{err: &OpError{Op: fmt.Sprintf("list servers (catalog service %q)", cfg.ServerServiceName), Err: err, token: cc.token}}
	}
	addrs := make([]string, 0, len(entries))
	for _, e := range entries {
		host := e.ServiceAddress
		if host == "" {
			host = e.Address
		}
		if host == "" || e.ServicePort <= 0 {
			continue
		}
		addrs = append(addrs, net.JoinHostPort(host, strconv.Itoa(e.ServicePort)))
	}
	slices.Sort(addrs)
	return serversAnswer{addrs: slices.Compact(addrs), index: meta.LastIndex}
}

// awaitServerWatch waits for the watch's goroutine to end, at most limit;
// one that does not is abandoned with a warning.
func (s *Syncer) awaitServerWatch(done <-chan struct{}, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("consul server watch did not stop in time; abandoning it", "waited", limit)
	}
}
