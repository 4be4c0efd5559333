package registry

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestViolationWait(t *testing.T) {
	tests := []struct {
		name     string
		n        int
		interval time.Duration
		r        float64 // the jitter draw
		want     time.Duration
	}{
		{"first violation waits the interval", 1, 10 * time.Second, 0, 10 * time.Second},
		{"jitter never goes below the interval", 1, 10 * time.Second, 0.99, 10 * time.Second},
		{"second doubles", 2, 10 * time.Second, 0, 20 * time.Second},
		{"third quadruples", 3, 10 * time.Second, 0, 40 * time.Second},
		{"jitter shortens by up to a fifth", 3, 10 * time.Second, 0.5, 36 * time.Second},
		{"jitter at its largest", 3, 10 * time.Second, 0.999999, 32 * time.Second},
		{"capped at two minutes", 5, 10 * time.Second, 0, 2 * time.Minute},
		{"still capped much later", 1000, 10 * time.Second, 0, 2 * time.Minute},
		{"jitter below the cap", 1000, 10 * time.Second, 0.5, 108 * time.Second},
		{"an interval above the cap is the cap", 3, 5 * time.Minute, 0, 5 * time.Minute},
		{"short intervals round to milliseconds", 2, 100 * time.Millisecond, 0.123, 195 * time.Millisecond},
		{"seconds round to tenths", 4, 200 * time.Millisecond, 0.5, 1400 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := violationWait(tt.n, tt.interval, tt.r); got != tt.want {
				t.Errorf("violationWait(%d, %s, %v) = %s, want %s", tt.n, tt.interval, tt.r, got, tt.want)
			}
		})
	}
}

func TestViolationWaitGrowsMonotonically(t *testing.T) {
	// Without jitter every wait is at least the one before, and the series
	// reaches the cap without overflowing.
	prev := time.Duration(0)
	for n := 1; n <= 200; n++ {
		got := violationWait(n, 3*time.Second, 0)
		if got < prev || got > maxViolationBackoff {
			t.Fatalf("wait after %d violations = %s (previous %s), want a non-decreasing series capped at %s",
				n, got, prev, maxViolationBackoff)
		}
		prev = got
	}
	if prev != maxViolationBackoff {
		t.Errorf("wait after 200 violations = %s, want the cap %s", prev, maxViolationBackoff)
	}
}

func TestViolationDescription(t *testing.T) {
	oversized := status.Error(codes.ResourceExhausted, "reply of 104857605 bytes exceeds the 4194304-byte limit")
	tests := []struct {
		name string
		n    int
		err  error
		what string
		wait time.Duration
		want string
	}{
		{
			name: "the example of the design", n: 3, err: oversized, what: "probe", wait: 40 * time.Second,
			want: "plugin violates the gRPC protocol (3 times in a row): reply of 104857605 bytes exceeds the 4194304-byte limit; next probe in 40s",
		},
		{
			name: "a first violation does not count", n: 1, err: oversized, what: "probe", wait: 10 * time.Second,
			want: "plugin violates the gRPC protocol: reply of 104857605 bytes exceeds the 4194304-byte limit; next probe in 10s",
		},
		{
			name: "a wrapped error keeps the call it names", n: 2, what: "fingerprint", wait: 1500 * time.Millisecond,
			err:  fmt.Errorf("GetPluginInfo: %w", status.Error(codes.Internal, "malformed answer")),
			want: "plugin violates the gRPC protocol (2 times in a row): GetPluginInfo: malformed answer; next fingerprint in 1.5s",
		},
		{
			name: "csiclient's own opening is not repeated", n: 2, what: "probe", wait: time.Second,
			err:  status.Error(codes.ResourceExhausted, "protocol violation: the reply to /csi.v1.Identity/Probe is larger than the 1024-byte message cap"),
			want: "plugin violates the gRPC protocol (2 times in a row): the reply to /csi.v1.Identity/Probe is larger than the 1024-byte message cap; next probe in 1s",
		},
		{
			name: "a plain error", n: 2, err: errors.New("bad frame"), what: "probe", wait: 200 * time.Millisecond,
			want: "plugin violates the gRPC protocol (2 times in a row): bad frame; next probe in 200ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := violationDescription(tt.n, tt.err, tt.what, tt.wait); got != tt.want {
				t.Errorf("description = %q\nwant          %q", got, tt.want)
			}
		})
	}
}

func TestViolationMessageIsCapped(t *testing.T) {
	// A multi-byte rune straddles the cap: the cut must not split it.
	msg := strings.Repeat("a", maxViolationMessage-1) + "é" + strings.Repeat("b", 10<<20)
	got := violationMessage(status.Error(codes.Internal, msg))
	if len(got) > maxViolationMessage+len("…") || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("message of %d bytes (valid UTF-8: %v), want at most %d bytes of valid UTF-8 ending in …",
			len(got), utf8.ValidString(got), maxViolationMessage+len("…"))
	}
	if short := violationMessage(errors.New("short")); short != "short" {
		t.Errorf("short message = %q, want it unchanged", short)
	}
}

// errViolation is what the tests' classifier calls a protocol violation.
var errViolation = status.Error(codes.ResourceExhausted, "reply of 9000 bytes exceeds the 1024-byte limit")

func TestViolationBackoffObserve(t *testing.T) {
	const interval = time.Second
	b := violationBackoff{
		what:        "probe",
		isViolation: func(err error) bool { return errors.Is(err, errViolation) },
		random:      func() float64 { return 0 },
	}
	timeout := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	steps := []struct {
		err       error
		wantWait  time.Duration
		wantCount int
		wantDesc  string // a part of the description; "" for none
	}{
		{errViolation, time.Second, 1, "plugin violates the gRPC protocol: reply of 9000 bytes"},
		{errViolation, 2 * time.Second, 2, "(2 times in a row)"},
		{fmt.Errorf("GetPluginInfo: %w", errViolation), 4 * time.Second, 3, "(3 times in a row): GetPluginInfo: "},
		{nil, 0, 0, ""}, // an answer resets
		{errViolation, time.Second, 1, "; next probe in 1s"},
		{timeout, 0, 0, ""}, // so does any other failure: not consecutive
		{errViolation, time.Second, 1, "plugin violates the gRPC protocol: "},
	}
	for i, st := range steps {
		wait, desc := b.observe(st.err, interval)
		if wait != st.wantWait || b.violations() != st.wantCount {
			t.Errorf("step %d (%v): wait %s after %d violations, want %s after %d", i, st.err, wait, b.violations(), st.wantWait, st.wantCount)
		}
		if (st.wantDesc == "") != (desc == "") || !strings.Contains(desc, st.wantDesc) {
			t.Errorf("step %d (%v): description %q, want one containing %q", i, st.err, desc, st.wantDesc)
		}
	}
}
