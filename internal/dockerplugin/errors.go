package dockerplugin

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// callError is an error of the servers as the engine reads it: msg says
// what failed and what to do; err is the servers' error, for logs and
// errors.Is.
type callError struct {
	msg string
	err error
}

func (e *callError) Error() string { return e.msg }
func (e *callError) Unwrap() error { return e.err }

// clusterError turns err, the error of the servers' answer to what (such
// as `create volume "v1"`), into an error that says what to do, by its
// gRPC code.
func clusterError(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &callError{err: err, msg: fmt.Sprintf("%s: no answer from the csisupd servers within %s (%v); check `csisupd status` and retry", what, requestTimeout, err)}
	}
	st := status.Convert(err)
	msg := st.Message()
	var advice string
	switch st.Code() {
	case codes.NotFound:
		advice = fmt.Sprintf("%s: %s", what, msg)
	case codes.FailedPrecondition:
		advice = fmt.Sprintf("%s refused: %s", what, msg)
	case codes.InvalidArgument, codes.OutOfRange:
		advice = fmt.Sprintf("%s: the servers refused the request: %s; fix the volume's options (-o) and retry", what, msg)
	case codes.AlreadyExists:
		advice = fmt.Sprintf("%s: %s; choose another name or remove the existing volume first", what, msg)
	case codes.PermissionDenied:
		advice = fmt.Sprintf("%s: permission denied (%s): the agent's ACL token lacks volume:write; give the agent a token whose policy grants volume:write", what, msg)
	case codes.Unauthenticated:
		advice = fmt.Sprintf("%s: the servers do not accept the agent's credentials (%s); check the agent's ACL token and node identity", what, msg)
	case codes.Unavailable:
		if csisupdv1.IsRetryable(err) || hasClaimRefused(err) {
			// The servers answered: the request may pass later (a
			// plugin recovering, a leader being elected, a claim
			// deferred).
			advice = fmt.Sprintf("%s failed for now: %s; retry in a moment", what, msg)
		} else {
			advice = fmt.Sprintf("%s: the csisupd servers cannot be reached (%s); check that the servers run and that this agent is connected (`csisupd node status`), then retry", what, msg)
		}
	case codes.DeadlineExceeded, codes.Canceled:
		advice = fmt.Sprintf("%s: no answer from the csisupd servers in time (%s); check `csisupd status` and retry", what, msg)
	case codes.ResourceExhausted:
		advice = fmt.Sprintf("%s refused: %s; retry later", what, msg)
	default:
		advice = fmt.Sprintf("%s failed: %s", what, msg)
	}
	return &callError{err: err, msg: advice}
}

// hasClaimRefused reports whether err carries a ClaimRefused detail.
func hasClaimRefused(err error) bool {
	_, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	return ok
}

// isNotFound reports whether err is the servers' NotFound of a volume
// (not of a plugin, which is NotFound too).
func isNotFound(err error) bool {
	return status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err)
}
