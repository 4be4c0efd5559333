package testplugin

import (
	"context"
	"maps"
	"os"
	"path"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Faults are runtime fault knobs, set with Plugin.SetFaults. The zero value
// injects nothing. Delays end early, with the context's error, when the
// call's context ends or the plugin stops.
type Faults struct {
	// ProbeNotReady makes Probe answer ready=false.
	ProbeNotReady bool
	// ProbeError makes Probe fail with this code (codes.OK = no error).
	ProbeError codes.Code
	// ProbeDelay delays every Probe answer.
	ProbeDelay time.Duration
	// ProbeHang makes Probe block until the call's context ends.
	ProbeHang bool
	// PublishDelay delays every ControllerPublishVolume call.
	PublishDelay time.Duration
	// Delays delays calls by method name (for example "CreateVolume").
	Delays map[string]time.Duration
	// Errors fails calls by method name with the given code, after any delay.
	Errors map[string]codes.Code
	// AnswerDelays delays the answer of calls by method name after the
	// call has done its work: a caller that gives up, or dies, in the
	// meantime loses an answer whose effect is already there.
	AnswerDelays map[string]time.Duration
}

// SetFaults replaces the fault knobs; it copies f's maps.
func (p *Plugin) SetFaults(f Faults) {
	f.Delays = maps.Clone(f.Delays)
	f.Errors = maps.Clone(f.Errors)
	p.faultsMu.Lock()
	p.faults = f
	p.faultsMu.Unlock()
}

func (p *Plugin) currentFaults() Faults {
	p.faultsMu.RLock()
	defer p.faultsMu.RUnlock()
	return p.faults
}

// checkSecrets refuses a call that can carry secrets and lacks
// Config.RequiredSecrets.
func (p *Plugin) checkSecrets(method string, req any) error {
	r, ok := req.(interface{ GetSecrets() map[string]string })
	if !ok {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(p.cfg.RequiredSecrets)) {
		if got, ok := r.GetSecrets()[k]; !ok || got != p.cfg.RequiredSecrets[k] {
			return status.Errorf(codes.Unauthenticated, "testplugin: %s needs secret %q, missing or wrong", method, k)
		}
	}
	return nil
}

// interceptor returns the server's interceptor: it counts every call,
// cancels it when runCtx ends (the plugin stops), applies the method
// delays and errors of the current faults, and with Config.Journal
// journals Node and Controller calls before they start and before they
// answer.
func (p *Plugin) interceptor(runCtx context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := path.Base(info.FullMethod)
		p.recordSecrets(method, req)
		// Read before the call is counted: a call that Stats shows in
		// flight has its slow delay, whatever SetSlow does after.
		slow := time.Duration(p.slow.Load())
		p.callStarted(method)
		defer p.callEnded(method)
		if err := p.checkSecrets(method, req); err != nil {
			return nil, err
		}

		var rec JournalRecord
		jn := p.journal != nil && journaled(info.FullMethod)
		if jn {
			// Before anything else, so a record covers every effect.
			rec = journalRequest(method, req)
			rec.Phase = JournalBegin
			if err := p.journal.write(&rec); err != nil {
				return nil, status.Errorf(codes.Internal, "testplugin: %s not done: %v", method, err)
			}
		}

		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(runCtx, cancel)()

		if slow > 0 && journaled(info.FullMethod) {
			// Slow mode waits whatever the caller does: a slow plugin
			// acts late, after its caller may have given up. Only
			// stopping the plugin ends the wait early.
			if err := sleep(runCtx, slow); err != nil {
				return nil, err
			}
		}

		f := p.currentFaults()
		delay := f.Delays[method]
		if method == "ControllerPublishVolume" {
			delay += f.PublishDelay
		}
		resp, err := p.serve(ctx, req, method, delay, f.Errors[method], handler)
		if mutating[method] && p.crashArmed.CompareAndSwap(true, false) {
			// The work is done and saved; its caller is never told, and
			// the journal has no end record for it.
			p.logger.Info("crashing in the middle of a call, as armed", "method", method, "code", status.Code(err))
			p.crash()
		}
		if jn {
			// Before the answer: a caller never sees an effect the
			// journal does not hold. Code is the work's outcome; a
			// lost answer below does not undo the effect.
			journalOutcome(&rec, resp, err)
			if jerr := p.journal.write(&rec); jerr != nil {
				return nil, status.Errorf(codes.Internal, "testplugin: %s done with code %s but not journaled: %v", method, status.Code(err), jerr)
			}
		}
		p.logger.Debug("call", "method", method, "code", status.Code(err))
		if err == nil {
			if err := sleep(ctx, f.AnswerDelays[method]); err != nil {
				return nil, err
			}
		}
		return resp, err
	}
}

// SetSlow turns slow mode on with delay d, or off with 0: every Node and
// Controller call that starts after it waits d before its work, even
// after its caller gave up (a stopped plugin's calls end early). A call
// that Stats already counts in flight keeps the delay it started with.
// Faults.Delays, which end with the caller, still apply after it.
func (p *Plugin) SetSlow(d time.Duration) {
	p.slow.Store(int64(max(d, 0)))
}

// ArmCrash makes the next mutating call (CreateVolume, NodePublishVolume
// and the like) crash after its work is done and saved, before its answer
// and before the journal's end record: Config.Crash is called, and
// without it the process exits with status 3. One call crashes per
// arming.
func (p *Plugin) ArmCrash() { p.crashArmed.Store(true) }

func (p *Plugin) crash() {
	if p.cfg.Crash != nil {
		p.cfg.Crash()
		return
	}
	os.Exit(ExitCrash)
}

// serve runs one call: the injected delay and error, then the handler,
// logging a successful node call.
func (p *Plugin) serve(ctx context.Context, req any, method string, delay time.Duration, code codes.Code, handler grpc.UnaryHandler) (any, error) {
	if err := sleep(ctx, delay); err != nil {
		return nil, err
	}
	if code != codes.OK {
		return nil, status.Errorf(code, "testplugin: injected %s error for %s", code, method)
	}
	resp, err := handler(ctx, req)
	if err == nil {
		p.logNodeCall(req)
	}
	return resp, err
}

// sleep waits for d or until ctx ends, then returns ctx's error as a status.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}
