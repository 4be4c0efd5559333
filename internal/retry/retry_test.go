package retry

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waits returns the first n waits of a fresh state of p.
func waits(p Policy, n int) []time.Duration {
	b := p.NewBackOff()
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = b.NextBackOff()
	}
	return out
}

func TestGrowthAndCapWithoutJitter(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		p    Policy
		want []time.Duration
	}{
		{"doubles up to the cap", Policy{Base: 100 * ms, Cap: time.Second, Multiplier: 2},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}},
		{"a cap that is no power of the base", Policy{Base: 5 * ms, Cap: 100 * ms, Multiplier: 2},
			[]time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 100 * ms, 100 * ms}},
		{"multiplier 1 keeps the base", Policy{Base: 2 * time.Second, Cap: time.Minute, Multiplier: 1},
			[]time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"cap equal to the base", Policy{Base: 2 * time.Second, Cap: 2 * time.Second, Multiplier: 2},
			[]time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"a fractional multiplier", Policy{Base: time.Second, Cap: 3 * time.Second, Multiplier: 1.5},
			[]time.Duration{time.Second, 1500 * ms, 2250 * ms, 3 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Validate(); err != nil {
				t.Fatal(err)
			}
			got := waits(tt.p, len(tt.want))
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("waits = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestNeverGivesUp(t *testing.T) {
	// A loop that retries forever must never be told to stop
	// (backoff.Stop is -1), nor overflow once the interval is capped.
	p := Policy{Base: time.Millisecond, Cap: 24 * time.Hour, Multiplier: 3, Jitter: 0.5}
	b := p.NewBackOff()
	maxWait := time.Duration(float64(p.Cap)*(1+p.Jitter)) + 1
	for i := range 10000 {
		if d := b.NextBackOff(); d <= 0 || d > maxWait {
			t.Fatalf("wait %d = %s, want one in (0, %s]", i, d, maxWait)
		}
	}
}

func TestJitterStaysWithinBounds(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
	}{
		{"half, the default shape", Policy{Base: 500 * time.Millisecond, Cap: 30 * time.Second, Multiplier: 2, Jitter: 0.5}},
		{"a fifth", Policy{Base: 100 * time.Millisecond, Cap: time.Second, Multiplier: 2, Jitter: 0.2}},
		{"near one", Policy{Base: time.Second, Cap: 4 * time.Second, Multiplier: 2, Jitter: 0.99}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The interval each wait is drawn around: the waits without
			// jitter.
			plain := tt.p
			plain.Jitter = 0
			const n = 10
			want := waits(plain, n)
			firstMin, firstMax := time.Duration(math.MaxInt64), time.Duration(0)
			for range 1000 {
				got := waits(tt.p, n)
				for i, d := range got {
					lo := time.Duration(float64(want[i]) * (1 - tt.p.Jitter))
					// The library's draw may land one nanosecond past the
					// top of the range.
					hi := time.Duration(float64(want[i])*(1+tt.p.Jitter)) + 1
					if d < lo || d > hi {
						t.Fatalf("wait %d = %s, want one in [%s, %s] around %s", i, d, lo, hi, want[i])
					}
				}
				firstMin, firstMax = min(firstMin, got[0]), max(firstMax, got[0])
			}
			// The first retry is what spreads a herd: over a thousand
			// loops it covers most of its range, 2*Jitter*Base wide.
			if spread, width := firstMax-firstMin, time.Duration(2*tt.p.Jitter*float64(tt.p.Base)); spread < width/2 {
				t.Errorf("first waits spread over %s (%s to %s), want at least half of %s", spread, firstMin, firstMax, width)
			}
		})
	}
}

func TestLoopsStartedTogetherDoNotRetryInLockstep(t *testing.T) {
	p := Policy{Base: 500 * time.Millisecond, Cap: 30 * time.Second, Multiplier: 2, Jitter: 0.5}
	a, b := waits(p, 6), waits(p, 6)
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	if same == len(a) {
		t.Errorf("two loops waited %v and %v: in lockstep", a, b)
	}
	if a[0] == b[0] {
		t.Errorf("two loops make their first retry after the same %s", a[0])
	}
	// Without jitter they do wait alike: the comparison above can fail.
	p.Jitter = 0
	if a, b := waits(p, 6), waits(p, 6); a[0] != b[0] || a[5] != b[5] {
		t.Errorf("without jitter the waits differ: %v and %v", a, b)
	}
}

func TestReset(t *testing.T) {
	p := Policy{Base: 10 * time.Millisecond, Cap: time.Second, Multiplier: 2}
	b := p.NewBackOff()
	for range 5 {
		b.NextBackOff()
	}
	if d := b.NextBackOff(); d != 320*time.Millisecond {
		t.Fatalf("sixth wait = %s, want 320ms", d)
	}
	b.Reset()
	if d := b.NextBackOff(); d != p.Base {
		t.Errorf("wait after Reset = %s, want the base %s", d, p.Base)
	}
	if d := b.NextBackOff(); d != 2*p.Base {
		t.Errorf("second wait after Reset = %s, want %s", d, 2*p.Base)
	}
}

func TestValidate(t *testing.T) {
	valid := Policy{Base: time.Second, Cap: time.Minute, Multiplier: 2, Jitter: 0.5}
	tests := []struct {
		name   string
		change func(*Policy)
		want   string // substring of the error; "" for valid
	}{
		{"valid", func(*Policy) {}, ""},
		{"no jitter", func(p *Policy) { p.Jitter = 0 }, ""},
		{"cap equal to base", func(p *Policy) { p.Cap = p.Base }, ""},
		{"multiplier 1", func(p *Policy) { p.Multiplier = 1 }, ""},
		{"zero base", func(p *Policy) { p.Base = 0 }, "Base must be positive, got 0s"},
		{"negative base", func(p *Policy) { p.Base = -time.Second }, "Base must be positive"},
		{"cap below base", func(p *Policy) { p.Cap = time.Millisecond }, "Cap 1ms must not be below Base 1s"},
		{"zero multiplier", func(p *Policy) { p.Multiplier = 0 }, "Multiplier must be at least 1, got 0"},
		{"shrinking multiplier", func(p *Policy) { p.Multiplier = 0.5 }, "Multiplier"},
		{"NaN multiplier", func(p *Policy) { p.Multiplier = math.NaN() }, "Multiplier"},
		{"negative jitter", func(p *Policy) { p.Jitter = -0.1 }, "Jitter must be in [0, 1), got -0.1"},
		{"jitter of one", func(p *Policy) { p.Jitter = 1 }, "Jitter"},
		{"NaN jitter", func(p *Policy) { p.Jitter = math.NaN() }, "Jitter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := valid
			tt.change(&p)
			err := p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate(%v) = %v, want nil", p, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate(%v) = %v, want an error containing %q", p, err, tt.want)
			}
		})
	}
	if err := (Policy{}).Validate(); err == nil {
		t.Error("the zero Policy is valid, want it refused")
	}
}

func TestWait(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelExpired()
	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want error
	}{
		{"a short wait ends", context.Background(), time.Millisecond, nil},
		{"no wait", context.Background(), 0, nil},
		{"a negative wait is none", context.Background(), -time.Second, nil},
		{"an ended context wins over no wait", cancelled, 0, context.Canceled},
		{"an ended context ends a long wait", cancelled, time.Hour, context.Canceled},
		{"a deadline ends a long wait", expired, time.Hour, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := Wait(tt.ctx, tt.d); !errors.Is(err, tt.want) {
				t.Errorf("Wait(%s) = %v, want %v", tt.d, err, tt.want)
			}
		})
	}
}

func TestWaitEndsWhenContextIsCancelledDuringIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Wait(ctx, time.Hour) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Wait = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait of an hour did not end within 10s of its context's cancellation")
	}
}

// gRPC's reconnect backoff gets the policy field for field.
func TestPolicyAsGRPCBackoff(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Cap: 3 * time.Second, Multiplier: 1.6, Jitter: 0.2}
	cp := p.ConnectParams(5 * time.Second)
	b := cp.Backoff
	if b.BaseDelay != p.Base || b.MaxDelay != p.Cap || b.Multiplier != p.Multiplier || b.Jitter != p.Jitter || cp.MinConnectTimeout != 5*time.Second {
		t.Errorf("ConnectParams = %+v, want the policy %s and a 5s attempt", cp, p)
	}
}
