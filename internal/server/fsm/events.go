package fsm

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/stream"
)

// Topics of cluster events in the event buffer; the key of an event is
// the id of the node, plugin or volume it is about.
const (
	TopicNode   = "node"
	TopicPlugin = "plugin"
	TopicVolume = "volume"
)

// Event is a cluster event as the buffer holds it.
type Event = stream.Event[*csisupdv1.ClusterEvent]

// Topic returns the topic and key of e, from its type.
func Topic(e *csisupdv1.ClusterEvent) (topic, key string) {
	switch typ := e.GetType(); {
	case strings.HasPrefix(typ, "volume-"):
		return TopicVolume, e.GetVolumeId()
	case strings.HasPrefix(typ, "plugin-"):
		return TopicPlugin, e.GetPluginId()
	default:
		return TopicNode, e.GetNodeId()
	}
}

// Events holds the events of the entries the FSM applied, for
// WatchEvents. The FSM publishes the events of each applied raft entry as
// one batch whose index is the entry's raft index.
//
// A snapshot restore replaces the state without events, so the events
// buffered before it no longer lead up to the state: restore closes the
// buffer and starts a new one. A subscription of the closed buffer is
// given the batches it had not read, then ends as gone (read the state
// again), and so does a new subscription that wants events after an
// index older than the restore: the restore point is the floor under
// which the current history does not reach.
//
// It is safe for concurrent use; publish and restore are called from the
// FSM's one goroutine.
type Events struct {
	cfg    stream.Config
	logger hclog.Logger

	mu  sync.RWMutex
	buf *stream.Buffer[*csisupdv1.ClusterEvent]
	// floor is the index of the latest restore: a subscription after a
	// non-zero index below it is gone. 0 before any restore.
	floor  uint64
	closed bool
}

// Sub is one subscription of the cluster events, with the buffer it
// reads, which a restore may replace.
type Sub struct {
	*stream.Subscription[*csisupdv1.ClusterEvent]
	buf *stream.Buffer[*csisupdv1.ClusterEvent]
}

// ErrClosed is returned for a subscription that ended because the server
// is shutting down.
var ErrClosed = errors.New("cluster events closed: the server is shutting down")

// NewEvents returns an empty event holder with buffers of cfg.
func NewEvents(cfg stream.Config, logger hclog.Logger) (*Events, error) {
	buf, err := stream.New[*csisupdv1.ClusterEvent](cfg)
	if err != nil {
		return nil, fmt.Errorf("cluster event buffer: %w", err)
	}
	return &Events{cfg: cfg, logger: logger, buf: buf}, nil
}

// Publish publishes the events of the raft entry at index as one batch; an
// entry without events only moves the latest index. A refused publish is
// logged: events are a view of the state, and the FSM goes on without
// them.
func (c *Events) Publish(index uint64, events ...Event) {
	c.mu.RLock()
	buf := c.buf
	c.mu.RUnlock()
	if err := buf.Publish(index, events...); err != nil {
		c.logger.Error("cluster events not published", "index", index, "events", len(events), "error", err)
	}
}

// Restore starts a new buffer after a snapshot restore at index: every
// subscription of the old buffer ends as gone once it has read what was
// buffered, and so does every later one after an index below index.
func (c *Events) Restore(index uint64) error {
	buf, err := stream.New[*csisupdv1.ClusterEvent](c.cfg)
	if err != nil {
		return fmt.Errorf("cluster event buffer: %w", err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	old := c.buf
	c.buf = buf
	c.floor = max(c.floor, index)
	c.mu.Unlock()
	old.Close()
	return nil
}

// Subscribe starts a subscription of the events after index after, or of
// the events published from now on when noReplay is set. It returns a
// *stream.GoneError when after is older than the buffer or than the
// latest restore (after == 0 is never gone).
func (c *Events) Subscribe(after uint64, noReplay bool) (*Sub, error) {
	c.mu.RLock()
	buf, floor, closed := c.buf, c.floor, c.closed
	c.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if noReplay {
		_, after = buf.Range()
	}
	if after != 0 && after < floor {
		return nil, fmt.Errorf("subscribe after index %d: %w", after, c.goneAfterRestore(after))
	}
	sub, err := buf.Subscribe(stream.Request{After: after})
	if err != nil {
		return nil, err
	}
	return &Sub{Subscription: sub, buf: buf}, nil
}

// Ended translates the error that ended sub's Next: stream.ErrClosed means a
// restore replaced sub's buffer (gone: the state changed without events)
// or the server is shutting down (ErrClosed). Other errors are
// returned as they are.
func (c *Events) Ended(sub *Sub, err error) error {
	if !errors.Is(err, stream.ErrClosed) {
		return err
	}
	c.mu.RLock()
	closed, replaced := c.closed, c.buf != sub.buf
	c.mu.RUnlock()
	if closed || !replaced {
		return ErrClosed
	}
	return fmt.Errorf("cluster events after index %d: %w", sub.Index(), c.goneAfterRestore(sub.Index()))
}

// goneAfterRestore is the GoneError of a subscription after index after,
// which a restore left behind: the history starts at the restore, or at the
// oldest batch buffered since.
func (c *Events) goneAfterRestore(after uint64) *stream.GoneError {
	c.mu.RLock()
	buf, floor := c.buf, c.floor
	c.mu.RUnlock()
	oldest, _ := buf.Range()
	return &stream.GoneError{After: after, Oldest: max(oldest, floor)}
}

// Close closes the buffer for shutdown: subscriptions are given what is
// buffered, then end with ErrClosed.
func (c *Events) Close() {
	c.mu.Lock()
	c.closed = true
	buf := c.buf
	c.mu.Unlock()
	buf.Close()
}
