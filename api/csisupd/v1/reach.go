package csisupdv1

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// NotReached reports whether err is the error of a call that reached no
// server: the connection to the address could not be made, so nothing
// answered and nothing was done. Only calls on a connection dialled with
// NotReachedInterceptors (as Dial's are) are marked; any other Unavailable
// error came from a server that answered, or from a connection that broke
// during the call.
func NotReached(err error) bool {
	var nr *notReachedError
	return errors.As(err, &nr)
}

// NotReachedInterceptors returns the dial options that mark the error of
// every call that reaches no server, for NotReached. The error keeps its
// gRPC status: code, message and details.
func NotReachedInterceptors() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(markNotReachedUnary),
		grpc.WithChainStreamInterceptor(markNotReachedStream),
	}
}

// notReachedError is the error of a call that reached no server.
type notReachedError struct{ err error }

func (e *notReachedError) Error() string { return e.err.Error() }
func (e *notReachedError) Unwrap() error { return e.err }

// GRPCStatus keeps the call's status, so that status.FromError and the
// typed details see through the mark.
func (e *notReachedError) GRPCStatus() *status.Status { return status.Convert(e.err) }

// markNotReachedUnary marks an Unavailable call that had no peer: gRPC
// sets the peer once a connection carries the call, so a call without one
// failed to connect.
func markNotReachedUnary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var p peer.Peer
	err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Peer(&p))...)
	if err != nil && p.Addr == nil && status.Code(err) == codes.Unavailable {
		return &notReachedError{err: err}
	}
	return err
}

// markNotReachedStream marks an Unavailable error of opening a stream: a
// stream is opened on a connection, so one that fails Unavailable had
// none.
func markNotReachedStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil && status.Code(err) == codes.Unavailable {
		return nil, &notReachedError{err: err}
	}
	return s, err
}
