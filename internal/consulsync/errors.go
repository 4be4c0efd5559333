package consulsync

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// redacted replaces the token wherever it would be shown.
const redacted = "[redacted]"

// OpError is a failed Consul request. It names the operation, explains ACL
// denials, and never shows the token. Unwrap returns consul/api's error.
type OpError struct {
	// Op names the operation, for example `register service "csi-plugin-a"`.
	Op  string
	Err error

	token string
}

// Error describes the failure; a 403 says what to check.
func (e *OpError) Error() string {
	msg := "consul: " + e.Op + ": " + e.Err.Error()
	var se api.StatusError
	if errors.As(e.Err, &se) && se.Code == http.StatusForbidden {
		body := strings.TrimSpace(se.Body)
		if strings.Contains(body, "ACL not found") {
			msg = fmt.Sprintf("consul: %s: Consul does not know the ACL token (HTTP 403: %s); check consul.token, %s or %s",
				e.Op, body, api.HTTPTokenEnvName, api.HTTPTokenFileEnvName)
		} else {
			msg = fmt.Sprintf("consul: %s: permission denied by Consul ACLs (HTTP 403: %s); the token needs service:write on csisupd's services",
				e.Op, body)
		}
	}
	return redact(msg, e.token)
}

// Unwrap returns the underlying error.
func (e *OpError) Unwrap() error { return e.Err }

// PermissionDenied reports whether Consul answered 403.
func (e *OpError) PermissionDenied() bool { return statusCode(e.Err) == http.StatusForbidden }

func statusCode(err error) int {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

func redact(s, token string) string {
	if token == "" {
		return s
	}
	return strings.ReplaceAll(s, token, redacted)
}

// redactErr wraps err so its message never shows token.
func redactErr(err error, token string) error {
	if err == nil || token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return &redactedError{err: err, token: token}
}

type redactedError struct {
	err   error
	token string
}

func (e *redactedError) Error() string { return redact(e.err.Error(), e.token) }
func (e *redactedError) Unwrap() error { return e.err }

// failureLogEvery is how often an unchanged sync failure is logged again
// at error level; in between it is logged at debug level.
const failureLogEvery = 5 * time.Minute

// repeatLog decides whether a failure is logged at warning or error
// level: a new message, or the same one last logged failureLogEvery ago.
type repeatLog struct {
	msg string
	at  time.Time
}

// fresh reports whether msg is to be logged at the higher level now, and
// if so remembers it.
func (r *repeatLog) fresh(msg string, now time.Time) bool {
	if msg == r.msg && now.Sub(r.at) < failureLogEvery {
		return false
	}
	r.msg, r.at = msg, now
	return true
}

// logFailure logs a failed pass at error level when the error is new or
// was last logged failureLogEvery ago, else at debug level.
func (s *Syncer) logFailure(err error, failures int, retryIn time.Duration) {
	msg := err.Error()
	if s.failLog.fresh(msg, s.now()) {
		s.log.Error("consul sync failed; will retry", "error", msg, "failed_passes", failures, "retry_in", retryIn)
		return
	}
	s.log.Debug("consul sync still failing", "failed_passes", failures, "retry_in", retryIn)
}

// passError collects the failures of one pass.
type passError struct{ errs []error }

func (e *passError) Error() string {
	const show = 3
	msgs := make([]string, 0, show)
	for _, err := range e.errs[:min(show, len(e.errs))] {
		msgs = append(msgs, err.Error())
	}
	msg := strings.Join(msgs, "; ")
	if n := len(e.errs) - show; n > 0 {
		msg += fmt.Sprintf("; and %d more", n)
	}
	return msg
}

func (e *passError) Unwrap() []error { return e.errs }
