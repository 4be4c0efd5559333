package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// probeLogFlushInterval bounds how long a probe line stays in the buffer,
// so a test reading the file while the plugins run lags by at most this.
const probeLogFlushInterval = 100 * time.Millisecond

// probeLog is the --probe-log file: one "<plugin id> <unix ns>" line per
// Probe served, from any number of plugins at once.
//
// testplugin.Config has no hook for calls and its gRPC server options are
// fixed inside the package, so the log hooks the one per-call signal the
// package already gives its callers: Config.Logger receives a debug line
// "call" with method=<name> after every call (see testplugin's
// interceptor). probeLog.logger wraps the command's logger and records that
// line for Probe; everything is still passed on to the real logger, whose
// level decides what is printed. main_test.go checks the lines appear, so
// a change of that debug line cannot silently empty the log.
type probeLog struct {
	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	err    error // first write error, reported by Close
	closed bool

	stop chan struct{}
	done chan struct{} // closed when the flusher returns
}

// openProbeLog opens (appending to) path and starts a flusher writing the
// buffer every interval.
func openProbeLog(path string, interval time.Duration) (*probeLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("probe log: %w", err)
	}
	l := &probeLog{f: f, w: bufio.NewWriter(f), stop: make(chan struct{}), done: make(chan struct{})}
	go l.flushEvery(interval)
	return l, nil
}

func (l *probeLog) flushEvery(interval time.Duration) {
	defer close(l.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			l.mu.Lock()
			l.flushLocked()
			l.mu.Unlock()
		}
	}
}

func (l *probeLog) flushLocked() {
	if l.w.Buffered() == 0 {
		return
	}
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
}

// record appends one line; after Close it does nothing.
func (l *probeLog) record(id string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	var line [96]byte
	b := append(line[:0], id...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, t.UnixNano(), 10)
	b = append(b, '\n')
	if _, err := l.w.Write(b); err != nil && l.err == nil {
		l.err = err
	}
}

// Close stops the flusher, writes what is buffered and closes the file. It
// may be called again.
func (l *probeLog) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.flushLocked()
	err := errors.Join(l.err, l.f.Close())
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	return err
}

// logger returns next wrapped so that the Probe calls of plugin id are
// recorded.
func (l *probeLog) logger(next hclog.Logger, id string) hclog.Logger {
	return probeLogger{Logger: next, log: l, id: id}
}

// probeLogger passes every line on to Logger and records the "call" debug
// line of a Probe. Named, ResetNamed and With are wrapped too: testplugin
// derives its logger with them.
type probeLogger struct {
	hclog.Logger
	log *probeLog
	id  string
}

func (p probeLogger) Debug(msg string, args ...any) {
	if msg == "call" && isProbe(args) {
		p.log.record(p.id, time.Now())
	}
	p.Logger.Debug(msg, args...)
}

func (p probeLogger) Named(name string) hclog.Logger {
	return probeLogger{Logger: p.Logger.Named(name), log: p.log, id: p.id}
}

func (p probeLogger) ResetNamed(name string) hclog.Logger {
	return probeLogger{Logger: p.Logger.ResetNamed(name), log: p.log, id: p.id}
}

func (p probeLogger) With(args ...any) hclog.Logger {
	return probeLogger{Logger: p.Logger.With(args...), log: p.log, id: p.id}
}

// isProbe reports whether the key/value pairs hold method=Probe.
func isProbe(args []any) bool {
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == "method" {
			m, _ := args[i+1].(string)
			return m == "Probe"
		}
	}
	return false
}

// socketPluginID is the id csisupd gives the plugin on socket: the
// directory's name for <id>/csi.sock, the file's name without ".sock" for
// <id>.sock.
func socketPluginID(socket string) string {
	base := filepath.Base(socket)
	if base == "csi.sock" {
		return filepath.Base(filepath.Dir(socket))
	}
	return strings.TrimSuffix(base, ".sock")
}
