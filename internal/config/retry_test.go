package config

import (
	"reflect"
	"testing"

	"github.com/csisupd/csisupd/internal/retry"
)

func TestDefaultRetryPoliciesAreValidAndJittered(t *testing.T) {
	// Components refuse an invalid policy and never fill one in: every
	// default must pass their validation, and spread its loops.
	r := DefaultRetry()
	v := reflect.ValueOf(r)
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
	if got := Default().Retry; got != r {
		t.Errorf("Default().Retry = %+v, want DefaultRetry() %+v", got, r)
	}
}
