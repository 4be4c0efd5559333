package volumeops

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func TestTryNext(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "connection refused")
	slow := status.Error(codes.DeadlineExceeded, "agent too slow")
	for _, tc := range []struct {
		name      string
		confirmed bool
		err       error
		want      bool
	}{
		// A node heard from: only what IsRetryable says.
		{"confirmed, unreachable", true, unavailable, true},
		{"confirmed, slow", true, slow, false},
		{"confirmed, marked retryable", true, csisupdv1.MarkRetryable(status.Error(codes.Aborted, "busy"), "busy"), true},
		{"confirmed, refused", true, status.Error(codes.InvalidArgument, "bad name"), false},
		// A node not heard from may be gone: not reached in time is
		// reason enough to move on.
		{"unconfirmed, unreachable", false, unavailable, true},
		{"unconfirmed, slow", false, slow, true},
		{"unconfirmed, own deadline", false, fmt.Errorf("call agent: %w", context.DeadlineExceeded), true},
		{"unconfirmed, refused", false, status.Error(codes.InvalidArgument, "bad name"), false},
		{"unconfirmed, not found", false, status.Error(codes.NotFound, "no such volume"), false},
		{"unconfirmed, canceled", false, context.Canceled, false},
		{"unconfirmed, other", false, errors.New("boom"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tryNext(DefaultIsRetryable, candidate{nodeID: "n1", confirmed: tc.confirmed}, tc.err); got != tc.want {
				t.Fatalf("tryNext(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
