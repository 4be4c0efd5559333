package rpc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// RetryableCode reports whether a plugin call that failed with c may be
// repeated: the plugin was unreachable, overloaded, or ran out of time on its
// own. ClientCSI and the node volume manager retry the same codes.
func RetryableCode(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// contextError turns the error of an ended context into a gRPC status
// error: DeadlineExceeded or Canceled.
func contextError(ctx context.Context) error {
	return status.FromContextError(ctx.Err()).Err()
}

// redactError returns err with every secret value of req removed from its
// message. Code and details are kept. An error whose message carries no
// secret is returned as it is.
func redactError(err error, req proto.Message) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := RedactString(st.Message(), req)
	if msg == st.Message() {
		return err
	}
	p := st.Proto()
	p.Message = msg
	return status.FromProto(p).Err()
}
