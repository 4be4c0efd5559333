package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/retry"
)

// noLeaderRetry spaces the attempts of a call the servers refused for want
// of a leader: an election takes a few heartbeat timeouts, and the jitter
// keeps many CLIs refused together from coming back together.
var noLeaderRetry = retry.Policy{Base: 200 * time.Millisecond, Cap: 2 * time.Second, Multiplier: 2, Jitter: 0.5}

// retryNoLeader returns the unary client interceptor that retries a call
// refused with NoLeader (the servers applied nothing, so the call is safe
// to retry) with noLeaderRetry's jittered waits, until the call's deadline
// or, for a call without one, until limit after its first attempt. A call
// that still fails says how long it was retried. Streams are not retried.
func retryNoLeader(limit time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = start.Add(limit)
		}
		wait := noLeaderRetry.NewBackOff()
		var refused error
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			switch {
			case err == nil:
				return nil
			case csisupdv1.IsNoLeader(err):
				refused = err
			case refused != nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded):
				// The deadline ended an attempt that waited for a
				// leader: the refusal says more than the timeout.
				return &noLeaderRetriedError{err: refused, attempts: attempt, elapsed: time.Since(start)}
			default:
				return err
			}
			d := wait.NextBackOff()
			if time.Now().Add(d).After(deadline) {
				if attempt == 1 {
					return err
				}
				return &noLeaderRetriedError{err: err, attempts: attempt, elapsed: time.Since(start)}
			}
			if retry.Wait(ctx, d) != nil {
				return &noLeaderRetriedError{err: err, attempts: attempt, elapsed: time.Since(start)}
			}
		}
	}
}

// noLeaderRetriedError is the NoLeader refusal of a call that was retried
// in vain. Its status is the refusal's, with the retries said at the end
// of the message, so that the CLI's errors, which quote the servers'
// message, say them.
type noLeaderRetriedError struct {
	err      error
	attempts int
	elapsed  time.Duration
}

func (e *noLeaderRetriedError) retries() string {
	return fmt.Sprintf("still no leader after %d attempts over %s, within --timeout", e.attempts, e.elapsed.Round(100*time.Millisecond))
}

func (e *noLeaderRetriedError) Error() string { return e.err.Error() + "; " + e.retries() }
func (e *noLeaderRetriedError) Unwrap() error { return e.err }

// GRPCStatus is the refusal's status, its details kept, with the retries
// appended to its message.
func (e *noLeaderRetriedError) GRPCStatus() *status.Status {
	p := status.Convert(e.err).Proto()
	p.Message += "; " + e.retries()
	return status.FromProto(p)
}
