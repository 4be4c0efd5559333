package registry

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/csiclient"
)

// maxViolationBackoff caps the wait between two attempts at a plugin that
// keeps violating the gRPC protocol (or the probe interval, when that is
// longer). Such a plugin does not get better by being asked more often,
// and every attempt may cost a reply of up to the message size limit.
const maxViolationBackoff = 2 * time.Minute

// violationJitter is the largest fraction by which a backoff is shortened
// at random, so that plugins broken by the same upgrade do not keep being
// probed in the same instant.
const violationJitter = 0.2

// maxViolationMessage caps the part of a violation's error that goes into
// a health description: the text may quote what the plugin sent, and
// descriptions are stored, persisted and shown to operators.
const maxViolationMessage = 512

// violationBackoff spaces out the attempts (probes, or fingerprints) at a
// plugin that violates the gRPC protocol: an oversized reply, a malformed
// answer. Consecutive violations wait exponentially longer, from the probe
// interval up to maxViolationBackoff; any other result (an answer, a
// timeout, a refused connection) ends the series, and the caller's normal
// schedule applies again. It is used by one goroutine only.
type violationBackoff struct {
	// what names the attempt in descriptions: "probe" or "fingerprint".
	what string
	// isViolation classifies an error; nil means
	// csiclient.IsProtocolViolation.
	isViolation func(error) bool
	// random returns a number in [0, 1) for the jitter; nil means
	// math/rand/v2's Float64.
	random func() float64

	count int // consecutive violations
}

// observe records the result of one attempt (err is nil when the plugin
// answered) and returns how long to wait before the next attempt and a
// description of why, or (0, "") when err is no protocol violation.
func (b *violationBackoff) observe(err error, interval time.Duration) (time.Duration, string) {
	isViolation := b.isViolation
	if isViolation == nil {
		isViolation = csiclient.IsProtocolViolation
	}
	if err == nil || !isViolation(err) {
		b.count = 0
		return 0, ""
	}
	b.count++
	random := b.random
	if random == nil {
		random = rand.Float64
	}
	wait := violationWait(b.count, interval, random())
	return wait, violationDescription(b.count, err, b.what, wait)
}

// violations returns the number of consecutive violations.
func (b *violationBackoff) violations() int { return b.count }

// violationWait is the wait after the n-th consecutive violation (n >= 1):
// interval * 2^(n-1), capped at max(maxViolationBackoff, interval),
// shortened by up to violationJitter times r (r in [0, 1)), rounded for
// the description, and never below the interval.
func violationWait(n int, interval time.Duration, r float64) time.Duration {
	limit := max(maxViolationBackoff, interval)
	wait := interval
	for i := 1; i < n && wait < limit; i++ {
		wait *= 2
	}
	wait = min(wait, limit)
	wait -= time.Duration(float64(wait) * violationJitter * r)
	return max(roundWait(wait), interval)
}

// roundWait rounds a wait to what a description shows: whole seconds from
// ten seconds on, tenths from one second on, milliseconds below.
func roundWait(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= time.Second:
		return d.Round(100 * time.Millisecond)
	default:
		return d.Round(time.Millisecond)
	}
}

// violationDescription says why a plugin waits, for its health
// description, e.g. "plugin violates the gRPC protocol (3 times in a row):
// reply of 104857605 bytes exceeds the 4194304-byte limit; next probe in
// 40s".
func violationDescription(n int, err error, what string, wait time.Duration) string {
	times := ""
	if n > 1 {
		times = fmt.Sprintf(" (%d times in a row)", n)
	}
	return fmt.Sprintf("plugin violates the gRPC protocol%s: %s; next %s in %s", times, violationMessage(err), what, wait)
}

// violationMessage is the text of a violation: the status message of its
// gRPC error, after whatever the error was wrapped in (a fingerprint error
// names the failed call), without the "rpc error: code = ..." form and
// without csiclient's own "protocol violation: " opening, which the
// description already says; capped at maxViolationMessage bytes.
func violationMessage(err error) string {
	msg := err.Error()
	var se interface {
		error
		GRPCStatus() *status.Status
	}
	if errors.As(err, &se) {
		prefix, _ := strings.CutSuffix(msg, se.Error())
		if prefix == msg {
			prefix = "" // not wrapped by appending: keep the status alone
		}
		msg = prefix + strings.TrimPrefix(se.GRPCStatus().Message(), "protocol violation: ")
	}
	if len(msg) <= maxViolationMessage {
		return msg
	}
	cut := maxViolationMessage
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}
