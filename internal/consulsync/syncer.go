package consulsync

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Syncer keeps the Consul agent's services in line with the registry: one
// service for the csisupd agent and one per plugin, each with a health
// check. Create it with New and drive it with Run.
type Syncer struct {
	plugins  plugin.Source
	log      hclog.Logger
	now      func() time.Time
	metrics  *syncMetrics
	watchdog *watchdog.Monitor

	mu                sync.Mutex
	cfg               Config
	client            *consulClient
	warnedConsulToken bool

	reload  chan struct{}
	running atomic.Bool
	servers *serverWatch

	// The fields below belong to the goroutine running Run.

	// loop is Run's watchdog loop; nil outside Run and without a Watchdog.
	loop            *watchdog.Loop
	start           time.Time
	services        map[string]*serviceState
	seen            map[string]bool // service IDs this process ever wanted
	probationLogged map[string]bool
	failLog         repeatLog
}

// serviceState is what the Syncer remembers about one wanted service.
type serviceState struct {
	identity string
	// pending is set by a lifecycle change and cleared only when a
	// registration of the service succeeds. While it is set the service is
	// registered with csisupd's tags, even with tag override on.
	pending bool
	// refreshed is when the service's TTL check was last written.
	refreshed time.Time
}

// New validates cfg and returns a Syncer. It does not contact Consul; Run
// does, retrying until Consul answers.
func New(cfg Config) (*Syncer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	metrics, err := newSyncMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	client, err := newConsulClient(cfg)
	if err != nil {
		return nil, err
	}
	s := &Syncer{
		plugins:         cfg.Plugins,
		log:             cfg.Logger,
		now:             time.Now,
		metrics:         metrics,
		watchdog:        cfg.Watchdog,
		cfg:             cfg,
		client:          client,
		reload:          make(chan struct{}, 1),
		servers:         newServerWatch(cfg.ServerServiceName),
		services:        make(map[string]*serviceState),
		seen:            make(map[string]bool),
		probationLogged: make(map[string]bool),
	}
	s.start = s.now()
	s.warnConsulToken(client)
	s.log.Info("consul sync configured", "address", client.address, "token_source", string(client.source),
		"service", cfg.ServiceName, "tag_override", cfg.EnableTagOverride)
	return s, nil
}

// Reload replaces the configuration, for SIGHUP: token, address, names,
// tags and intervals. The plugin source cannot change (a nil Plugins keeps
// the current one), and the logger, metrics and watchdog stay the ones
// given to New. Services whose
// registration changes with the new configuration have a lifecycle change:
// they are registered again with csisupd's tags. A pass runs at once, even
// while backing off after failures.
func (s *Syncer) Reload(cfg Config) error {
	if cfg.Plugins == nil {
		cfg.Plugins = s.plugins
	}
	if cfg.Plugins != s.plugins {
		return errors.New("consulsync: Reload cannot change the plugin source (Plugins)")
	}
	cfg.Logger = s.log
	cur, _ := s.current()
	cfg.Metrics, cfg.Watchdog = cur.Metrics, s.watchdog
	if err := cfg.validate(); err != nil {
		return err
	}
	client, err := newConsulClient(cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old := s.client
	s.cfg, s.client = cfg, client
	s.mu.Unlock()
	old.close()
	s.servers.setService(cfg.ServerServiceName)
	select { // the server watch asks again with the new client
	case s.servers.restart <- struct{}{}:
	default:
	}
	s.warnConsulToken(client)
	s.log.Info("consul sync configuration reloaded", "address", client.address, "token_source", string(client.source))
	select {
	case s.reload <- struct{}{}:
	default:
	}
	return nil
}

// warnConsulToken logs, once per Syncer, that CONSUL_TOKEN is not read
// when it is set and the client has no token from anywhere else.
func (s *Syncer) warnConsulToken(cc *consulClient) {
	if os.Getenv(envConsulToken) == "" || cc.token != "" {
		return
	}
	s.mu.Lock()
	warned := s.warnedConsulToken
	s.warnedConsulToken = true
	s.mu.Unlock()
	if !warned {
		s.log.Warn(envConsulToken + " is set but not read: it is consul-template's variable, and csisupd talks to Consul without a token; " +
			"set consul.token, " + api.HTTPTokenEnvName + " or " + api.HTTPTokenFileEnvName + " instead")
	}
}

func (s *Syncer) current() (Config, *consulClient) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg, s.client
}

// Run syncs until ctx ends: a pass at once, on every registry change
// (coalesced), every SyncInterval and after Reload. A failed pass is
// retried after the Retry backoff, which grows with consecutive failures
// and is jittered; failures are logged, never returned. When ctx ends Run
// deregisters csisupd's services if DeregisterOnShutdown is set, within
// ShutdownTimeout; a failed deregistration is logged as a warning naming
// the services left behind, and does not make the stop fail. Run returns
// an error only when it is called a second time.
//
// Run's loop beats Config.Watchdog's loop "consul sync" on every turn and
// while it waits out a retry backoff, which may be longer than the
// watchdog's timeout, and is busy (watchdog.Loop.Busy) until the deadline
// of every request to Consul (each bounded by RequestTimeout). It stops
// beating when ctx ends; the deregistration that follows has its own
// deadline (ShutdownTimeout).
//
// Run also runs the server watch that Servers reads (see the package
// documentation) and waits for it to end, at most ShutdownTimeout.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("consulsync: Run called twice")
	}
	sub := s.plugins.Subscribe()
	defer sub.Close()
	s.start = s.now()
	s.loop = s.watchdog.Loop("consul sync")
	defer s.loop.Done()
	cfg, _ := s.current()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		s.watchServers(ctx)
	}()
	defer s.awaitServerWatch(watchDone, cfg.ShutdownTimeout)
	stop := func() {
		s.loop.Done()
		s.shutdown()
	}

	timer := time.NewTimer(cfg.SyncInterval)
	defer timer.Stop()
	failures := 0
	policy := cfg.Retry
	retries := policy.NewBackOff()
	for {
		var changes <-chan struct{}
		if failures == 0 {
			changes = sub.C() // while backing off, changes wait for the retry
		}
		s.loop.Beat()
		select {
		case <-ctx.Done():
			stop()
			return nil
		case <-s.loop.C():
			continue // idle, or waiting out a backoff: still turning
		case <-changes:
		case <-timer.C:
		case <-s.reload:
		}
		select { // this pass reads the latest state: drop a queued notification
		case <-sub.C():
		default:
		}
		err := s.syncPass(ctx)
		if ctx.Err() != nil {
			stop()
			return nil
		}
		cfg, _ = s.current()
		if cfg.Retry != policy { // a Reload changed it
			policy, retries = cfg.Retry, cfg.Retry.NewBackOff()
		}
		if err != nil {
			failures++
			wait := retries.NextBackOff()
			s.logFailure(err, failures, wait)
			timer.Reset(wait)
			continue
		}
		if failures > 0 {
			s.log.Info("consul sync recovered", "failed_passes", failures)
			s.failLog = repeatLog{}
		}
		failures = 0
		retries.Reset()
		timer.Reset(cfg.SyncInterval)
	}
}

// passStats counts the writes of one pass.
type passStats struct {
	registered, deregistered, checksRegistered, checksUpdated, checksDeregistered int
}

func (p passStats) writes() int {
	return p.registered + p.deregistered + p.checksRegistered + p.checksUpdated + p.checksDeregistered
}

// do runs one request with RequestTimeout.
func do(ctx context.Context, cfg Config, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	return f(ctx)
}

// request runs one request of a pass with RequestTimeout, telling Run's
// watchdog loop that it is busy until the request's deadline: a pass makes
// requests in proportion to the services, so it may take longer in all
// than the watchdog's timeout, and one request may too.
func (s *Syncer) request(ctx context.Context, cfg Config, f func(ctx context.Context) error) error {
	return do(ctx, cfg, func(ctx context.Context) error {
		deadline, _ := ctx.Deadline()
		s.loop.Busy(deadline)
		return f(ctx)
	})
}

// syncPass runs one pass and records it in the metrics. A pass cut short
// because ctx ended (shutdown) is not recorded.
func (s *Syncer) syncPass(ctx context.Context) error {
	began := time.Now() // the real clock: s.now may be a test's
	err := s.pass(ctx)
	if ctx.Err() != nil {
		return err
	}
	s.metrics.passes.Inc()
	s.metrics.duration.Observe(time.Since(began).Seconds())
	if err != nil {
		s.metrics.failures.WithLabelValues(failureReason(err)).Inc()
		return err
	}
	s.metrics.lastSuccess.Set(float64(s.now().UnixNano()) / float64(time.Second))
	return nil
}

func query(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{}).WithContext(ctx)
}

// pass makes the Consul agent's services and checks match the registry,
// like Consul's own anti-entropy: it reads the services once, registers
// what is missing or differs, deregisters csisupd's services that are no
// longer wanted, then does the same for checks. In steady state it makes
// two GETs and no writes.
func (s *Syncer) pass(ctx context.Context) error {
	cfg, cc := s.current()
	agent := cc.api.Agent()
	now := s.now()
	var errs []error
	fail := func(op string, err error) {
		errs = append(errs, &OpError{Op: op, Err: err, token: cc.token})
	}
	done := func(st passStats) error {
		args := []any{"registered", st.registered, "deregistered", st.deregistered,
			"checks_registered", st.checksRegistered, "checks_updated", st.checksUpdated,
			"checks_deregistered", st.checksDeregistered, "errors", len(errs)}
		switch {
		case st.registered+st.deregistered > 0:
			s.log.Info("consul sync pass changed services", args...)
		case st.writes() > 0:
			s.log.Debug("consul sync pass changed checks", args...)
		default:
			s.log.Trace("consul sync pass: no changes", "errors", len(errs))
		}
		if len(errs) == 0 {
			return nil
		}
		return &passError{errs: errs}
	}
	var st passStats

	want := desired(cfg, s.plugins.List())
	wanted := make(map[string]*wantService, len(want))
	for _, w := range want {
		wanted[w.id] = w
		state := s.services[w.id]
		if state == nil {
			state = &serviceState{}
			s.services[w.id] = state
		}
		if state.identity != w.identity {
			state.identity, state.pending = w.identity, true
		}
		s.seen[w.id] = true
	}
	for id := range s.services {
		if wanted[id] == nil {
			delete(s.services, id)
		}
	}

	var current map[string]*api.AgentService
	err := s.request(ctx, cfg, func(ctx context.Context) (err error) {
		current, err = agent.ServicesWithFilterOpts("", query(ctx))
		return err
	})
	if err != nil {
		fail("list services", err)
		return done(st)
	}

	// Services.
	present := make(map[string]bool, len(want))
	for _, w := range want {
		state := s.services[w.id]
		cur := current[w.id]
		reg := w.reg
		if cur != nil && !state.pending {
			if cfg.EnableTagOverride {
				adopted := *reg
				adopted.Tags = slices.Clone(cur.Tags)
				reg = &adopted
			}
			if serviceMatches(cur, reg) {
				present[w.id] = true
				continue
			}
		}
		err := s.request(ctx, cfg, func(ctx context.Context) error {
			return agent.ServiceRegisterOpts(reg, api.ServiceRegisterOpts{ReplaceExistingChecks: true}.WithContext(ctx))
		})
		if err != nil {
			fail(fmt.Sprintf("register service %q (id %s)", reg.Name, reg.ID), err)
			present[w.id] = cur != nil
			continue
		}
		s.metrics.wrote(opServiceRegister)
		state.pending = false
		state.refreshed = now
		present[w.id] = true
		st.registered++
		s.log.Debug("registered service", "id", reg.ID, "name", reg.Name)
	}
	kept := make(map[string]bool)
	for _, id := range sortedKeys(current) {
		if !isOwn(id) || wanted[id] != nil {
			continue
		}
		if !s.seen[id] && now.Before(s.start.Add(cfg.Probation)) {
			kept[id] = true
			if !s.probationLogged[id] {
				s.probationLogged[id] = true
				s.log.Info("keeping unknown csisupd service during probation", "id", id,
					"until", s.start.Add(cfg.Probation).Format(time.RFC3339))
			}
			continue
		}
		err := s.request(ctx, cfg, func(ctx context.Context) error {
			return agent.ServiceDeregisterOpts(id, query(ctx))
		})
		if err != nil && statusCode(err) != http.StatusNotFound {
			fail(fmt.Sprintf("deregister service %q (id %s)", current[id].Service, id), err)
			kept[id] = true
			continue
		}
		if err == nil { // a 404: already gone, nothing written
			s.metrics.wrote(opServiceDeregister)
		}
		delete(s.probationLogged, id)
		st.deregistered++
		s.log.Debug("deregistered service", "id", id, "name", current[id].Service)
	}

	// Checks.
	var checks map[string]*api.AgentCheck
	err = s.request(ctx, cfg, func(ctx context.Context) (err error) {
		checks, err = agent.ChecksWithFilterOpts("", query(ctx))
		return err
	})
	if err != nil {
		fail("list checks", err)
		return done(st)
	}
	wantedChecks := make(map[string]bool)
	for _, w := range want {
		if !present[w.id] {
			continue
		}
		state := s.services[w.id]
		for _, c := range w.checks {
			wantedChecks[c.id] = true
			cur := checks[c.id]
			var status, output string
			if cur != nil {
				status, output = cur.Status, cur.Output
			}
			if cur == nil || !checkMatches(cur, c) {
				err := s.request(ctx, cfg, func(ctx context.Context) error {
					return agent.CheckRegisterOpts(c.registration(), query(ctx))
				})
				if err != nil {
					fail(fmt.Sprintf("register check %s", c.id), err)
					continue
				}
				s.metrics.wrote(opCheckRegister)
				st.checksRegistered++
				state.refreshed = now
				if cur == nil { // a new check starts with the status given, without output
					status, output = c.status, ""
				}
			}
			if c.ttl == 0 {
				continue
			}
			if status == c.status && output == c.output && now.Sub(state.refreshed) < refreshAfter(c.ttl, c.id) {
				continue
			}
			err := s.request(ctx, cfg, func(ctx context.Context) error {
				return agent.UpdateTTLOpts(c.id, c.output, c.status, query(ctx))
			})
			if err != nil {
				fail(fmt.Sprintf("update check %s", c.id), err)
				continue
			}
			s.metrics.wrote(opCheckUpdate)
			state.refreshed = now
			st.checksUpdated++
		}
	}
	for _, id := range sortedKeys(checks) {
		cur := checks[id]
		if !isOwn(id) || wantedChecks[id] || kept[cur.ServiceID] || (wanted[cur.ServiceID] != nil && !present[cur.ServiceID]) {
			continue
		}
		err := s.request(ctx, cfg, func(ctx context.Context) error {
			return agent.CheckDeregisterOpts(id, query(ctx))
		})
		if err != nil && statusCode(err) != http.StatusNotFound {
			fail(fmt.Sprintf("deregister check %s", id), err)
			continue
		}
		if err == nil {
			s.metrics.wrote(opCheckDeregister)
		}
		st.checksDeregistered++
	}
	return done(st)
}

// shutdown releases the client and, if configured, deregisters every
// csisupd service the Consul agent holds. A deregistration that fails (Consul
// unreachable, a denied token) does not fail the stop: it is logged as a
// warning that names every service left behind, which Consul keeps until
// the agent starts again or an operator removes them.
func (s *Syncer) shutdown() {
	cfg, cc := s.current()
	defer cc.close()
	if !cfg.DeregisterOnShutdown {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	agent := cc.api.Agent()
	var ids []string
	current, err := agent.ServicesWithFilterOpts("", query(ctx))
	if err == nil {
		for id := range current {
			if isOwn(id) {
				ids = append(ids, id)
			}
		}
	} else {
		// Without a listing, remove what this process registered.
		for id := range s.services {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var errs []error
	var left []string
	removed := 0
	for _, id := range ids {
		if ctx.Err() != nil {
			left = append(left, id)
			continue
		}
		err := agent.ServiceDeregisterOpts(id, query(ctx))
		switch {
		case err == nil:
			s.metrics.wrote(opServiceDeregister)
			removed++
		case statusCode(err) != http.StatusNotFound:
			left = append(left, id)
			errs = append(errs, &OpError{Op: "deregister service " + id + " at shutdown", Err: err, token: cc.token})
		}
	}
	if len(left) == 0 {
		s.log.Info("deregistered csisupd services from Consul", "count", removed)
		return
	}
	s.log.Warn("could not deregister csisupd services from Consul at shutdown; they stay registered until csisupd starts again or an operator removes them",
		"left_behind", strings.Join(left, ","), "deregistered", removed, "error", (&passError{errs: errs}).Error())
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare[string])
	return keys
}
