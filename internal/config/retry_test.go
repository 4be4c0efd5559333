package config

import (
	"reflect"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/retry"
)

func TestDefaultRetry(t *testing.T) {
	// The bases and caps the loops had before they shared a policy, each
	// doubling and jittered by half.
	policy := func(base, limit time.Duration) retry.Policy {
		return retry.Policy{Base: base, Cap: limit, Multiplier: 2, Jitter: 0.5}
	}
	want := Retry{
		PluginRedial: policy(250*time.Microsecond, 100*time.Millisecond),
		Fingerprint:  policy(50*time.Millisecond, 5*time.Second),
		ClientCSI:    policy(100*time.Millisecond, 200*time.Millisecond),
		ConsulSync:   policy(time.Second, 30*time.Second),
		ServerJoin:   policy(2*time.Second, 2*time.Second),
		NodeClient:   policy(500*time.Millisecond, 30*time.Second),
		// gRPC's reconnect shape, with a cap of seconds.
		ServerConnect: retry.Policy{Base: 100 * time.Millisecond, Cap: 3 * time.Second, Multiplier: 1.6, Jitter: 0.2},

		// Capped at a minute.
		KubeletRegistration: policy(20*time.Second, time.Minute),
	}
	if got := DefaultRetry(); got != want {
		t.Errorf("DefaultRetry() =\n%+v\nwant\n%+v", got, want)
	}
}

func TestDefaultRetryPoliciesAreValidAndJittered(t *testing.T) {
	// Components refuse an invalid policy and never fill one in: every
	// default must pass their validation, and spread its loops.
	v := reflect.ValueOf(DefaultRetry())
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		p, ok := v.Field(i).Interface().(retry.Policy)
		if !ok {
			t.Fatalf("Retry.%s is a %s, want a retry.Policy", name, v.Field(i).Type())
		}
		if err := p.Validate(); err != nil {
			t.Errorf("Retry.%s: %v", name, err)
		}
		if p.Jitter <= 0 {
			t.Errorf("Retry.%s has no jitter: loops started together would retry in lockstep", name)
		}
	}
}
