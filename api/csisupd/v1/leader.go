package csisupdv1

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// LeaderTrailerKey is the trailer a server sets on the error of a request
// that the leader ran: the leader's name and RPC address, so that a
// caller that sent the request to any server can tell who answered. A
// follower that forwarded the request passes the leader's trailer on.
const LeaderTrailerKey = "csisupd-leader"

// maxLeaderTrailer caps the leader's description that a caller keeps.
const maxLeaderTrailer = 256

// AnsweringLeader returns the leader that answered a call that failed
// with err, as the server's LeaderTrailerKey trailer named it; only calls
// on a connection dialled with LeaderInterceptor carry it.
func AnsweringLeader(err error) (string, bool) {
	var la *leaderAnswerError
	if errors.As(err, &la) {
		return la.leader, true
	}
	return "", false
}

// LeaderInterceptor returns the dial option that keeps, on the error of
// every unary call, the leader the server named in its trailer, for
// AnsweringLeader. The error keeps its gRPC status.
func LeaderInterceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		var trailer metadata.MD
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
		if err == nil {
			return nil
		}
		if v := trailer.Get(LeaderTrailerKey); len(v) > 0 && v[0] != "" {
			leader := v[0]
			if len(leader) > maxLeaderTrailer {
				leader = strings.ToValidUTF8(leader[:maxLeaderTrailer], "") + "..."
			}
			return &leaderAnswerError{leader: leader, err: err}
		}
		return err
	})
}

// leaderAnswerError is the error of a call the leader answered.
type leaderAnswerError struct {
	leader string
	err    error
}

func (e *leaderAnswerError) Error() string { return e.err.Error() }
func (e *leaderAnswerError) Unwrap() error { return e.err }

// GRPCStatus keeps the call's status, so that status.FromError and the
// typed details see through the mark.
func (e *leaderAnswerError) GRPCStatus() *status.Status { return status.Convert(e.err) }
