package rpc

import (
	"errors"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestRetryableCode(t *testing.T) {
	retryable := map[codes.Code]bool{codes.Unavailable: true, codes.ResourceExhausted: true, codes.DeadlineExceeded: true}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if got := RetryableCode(c); got != retryable[c] {
			t.Errorf("RetryableCode(%s) = %t, want %t", c, got, retryable[c])
		}
	}
}

func TestRedactError(t *testing.T) {
	req := &csi.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"token": "tok-123"}}
	withDetail, err := status.New(codes.PermissionDenied, "token tok-123 refused").
		WithDetails(&errdetails.ErrorInfo{Reason: "AUTH"})
	if err != nil {
		t.Fatal(err)
	}
	clean := status.Error(codes.NotFound, "volume v not found")
	plain := errors.New("not a status")

	got := status.Convert(redactError(withDetail.Err(), req))
	if got.Code() != codes.PermissionDenied || got.Message() != "token "+Redacted+" refused" {
		t.Errorf("redacted status = %s %q", got.Code(), got.Message())
	}
	if d := got.Details(); len(d) != 1 || !proto.Equal(d[0].(proto.Message), &errdetails.ErrorInfo{Reason: "AUTH"}) {
		t.Errorf("details = %v, want the ErrorInfo kept", d)
	}
	if e := redactError(clean, req); e != clean {
		t.Errorf("an error without secrets was rebuilt: %v", e)
	}
	if e := redactError(plain, req); e != plain {
		t.Errorf("a non-status error was changed: %v", e)
	}
}
