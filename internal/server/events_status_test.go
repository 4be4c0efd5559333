package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/stream"
)

func TestEventsStatus(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"fell behind", fmt.Errorf("x: %w", &stream.FellBehindError{ResumeIndex: 7, Lag: 9, MaxLag: 4}), codes.ResourceExhausted, "resume from index 7"},
		{"gone", &stream.GoneError{After: 7, Oldest: 20}, codes.OutOfRange, "events after index 7 are no longer buffered (the oldest is 20)"},
		{"shutting down", fsm.ErrClosed, codes.Unavailable, "shutting down"},
		{"canceled", context.Canceled, codes.Canceled, ""},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded, ""},
		{"other", errors.New("boom"), codes.Internal, "boom"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := eventsStatus(tt.err)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("eventsStatus(%v) = %v, want %v mentioning %q", tt.err, err, tt.code, tt.msg)
			}
		})
	}
	fb, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsFellBehind](eventsStatus(&stream.FellBehindError{ResumeIndex: 7, Lag: 9, MaxLag: 4}))
	if !ok || fb.GetResumeIndex() != 7 || fb.GetLag() != 9 || fb.GetMaxLag() != 4 {
		t.Fatalf("fell behind detail %v, want resume 7, lag 9 of 4", fb)
	}
	g, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsGone](eventsStatus(&stream.GoneError{After: 7, Oldest: 20}))
	if !ok || g.GetAfter() != 7 || g.GetOldestIndex() != 20 {
		t.Fatalf("gone detail %v, want after 7, oldest 20", g)
	}
}
