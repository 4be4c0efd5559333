package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
)

// Policy describes the waits of one kind of retry loop. The zero Policy is
// not valid: a component rejects it (see Validate).
type Policy struct {
	// Base is the interval before the first retry. It must be positive.
	Base time.Duration
	// Cap is the longest interval, reached by growth; at least Base.
	// Jitter applies after it, so a wait is at most Cap*(1+Jitter).
	Cap time.Duration
	// Multiplier grows the interval after every wait; at least 1 (1 keeps
	// it at Base).
	Multiplier float64
	// Jitter is the randomization factor, in [0, 1): each wait is drawn
	// uniformly from [interval*(1-Jitter), interval*(1+Jitter)]. Zero
	// makes every wait exactly the interval.
	Jitter float64
}

// Validate reports the first field of p that is out of range, by name.
func (p Policy) Validate() error {
	switch {
	case p.Base <= 0:
		return fmt.Errorf("retry: Base must be positive, got %s", p.Base)
	case p.Cap < p.Base:
		return fmt.Errorf("retry: Cap %s must not be below Base %s", p.Cap, p.Base)
	case !(p.Multiplier >= 1): // also refuses NaN
		return fmt.Errorf("retry: Multiplier must be at least 1, got %v", p.Multiplier)
	case !(p.Jitter >= 0 && p.Jitter < 1):
		return fmt.Errorf("retry: Jitter must be in [0, 1), got %v", p.Jitter)
	}
	return nil
}

// String shows the policy as it is written in logs and errors.
func (p Policy) String() string {
	return fmt.Sprintf("base %s, cap %s, multiplier %v, jitter %v", p.Base, p.Cap, p.Multiplier, p.Jitter)
}

// GRPC returns p as gRPC's reconnect backoff, for connections whose
// redials gRPC itself schedules. gRPC applies the jitter the same way:
// each wait is drawn from interval*(1±Jitter).
func (p Policy) GRPC() grpcbackoff.Config {
	return grpcbackoff.Config{BaseDelay: p.Base, Multiplier: p.Multiplier, Jitter: p.Jitter, MaxDelay: p.Cap}
}

// ConnectParams returns gRPC's connect parameters with p as the reconnect
// backoff, giving each connection attempt at least minConnect
// (grpc.WithConnectParams).
func (p Policy) ConnectParams(minConnect time.Duration) grpc.ConnectParams {
	return grpc.ConnectParams{Backoff: p.GRPC(), MinConnectTimeout: minConnect}
}

// NewBackOff returns a fresh backoff state for one loop, at Base. p must
// be valid.
func (p Policy) NewBackOff() *BackOff {
	b := &BackOff{b: backoff.ExponentialBackOff{
		InitialInterval:     p.Base,
		MaxInterval:         p.Cap,
		Multiplier:          p.Multiplier,
		RandomizationFactor: p.Jitter,
	}}
	b.Reset()
	return b
}

// BackOff is the state of one retry loop. It is not safe for concurrent
// use: each loop has its own.
type BackOff struct {
	b backoff.ExponentialBackOff
}

// NextBackOff returns the wait before the next attempt and grows the
// interval. It never gives up.
func (b *BackOff) NextBackOff() time.Duration { return b.b.NextBackOff() }

// Reset returns the state to Base, after a success.
func (b *BackOff) Reset() { b.b.Reset() }

// Wait waits for d, or until ctx ends. It returns nil after d, and ctx's
// error when ctx ended first (at once when it already has). Its timer is
// stopped either way.
func Wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
