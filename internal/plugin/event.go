package plugin

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/stream"
)

// EventType names a kind of plugin event. The values are part of the
// external contract (`csisupd events --json`).
type EventType string

// Event types.
const (
	EventRegistered         EventType = "plugin-registered"
	EventHealthy            EventType = "plugin-healthy"
	EventUnhealthy          EventType = "plugin-unhealthy"
	EventDeregistered       EventType = "plugin-deregistered"
	EventFingerprintChanged EventType = "plugin-fingerprint-changed"
	// EventSocketIgnored reports a socket in the plugin directory (or a
	// plugin subdirectory) that is not dialled because it is not trusted:
	// a symlink, an owner that may not serve plugins, or a directory
	// writable by others. The description names the path and says why.
	// It is emitted once per path, and again when the reason changes.
	EventSocketIgnored EventType = "plugin-socket-ignored"
	// EventMissing reports a required plugin (plugin "<id>" { required =
	// true }) that has had no healthy instance for longer than its
	// health_timeout: its socket is absent, or its plugin unhealthy. It is
	// emitted once per episode; plugin-healthy ends the episode.
	EventMissing EventType = "plugin-missing"
	// EventConflict reports a claim on a plugin id (a declared socket, a
	// kubelet-registered endpoint, a socket in the plugin directory) that
	// was refused: another claim holds the id at another path (the plugin
	// in use there keeps it, or, when claims meet, the order declared,
	// kubelet registration, discovery decides), or the socket serves
	// another id. Its plugin id is the refused claim's; the description
	// names both paths (both ids for a socket), the one supervised and
	// why. Emitted once per conflict.
	EventConflict EventType = "plugin-conflict"

	// Volume events, emitted by the node volume manager with the volume
	// and workload set.
	EventVolumeStaged      EventType = "volume-staged"
	EventVolumePublished   EventType = "volume-published"
	EventVolumeUnpublished EventType = "volume-unpublished"
	EventVolumeUnstaged    EventType = "volume-unstaged"
	EventVolumeMountFailed EventType = "volume-mount-failed"
)

// EventTopic is the topic of plugin events in the event log; their key is
// the plugin id.
const EventTopic = "plugin"

// EventLog is the node's ordered log of plugin events, read by
// subscription (a stream.Buffer the registry publishes to). A subscriber
// that falls too far behind is told where to resume; see package stream.
type EventLog interface {
	// Subscribe starts a subscription after req.After.
	Subscribe(req stream.Request) (*stream.Subscription[Event], error)
	// AfterLast returns the After that replays the last n events.
	AfterLast(n int) uint64
	// Range returns the oldest buffered and the latest index.
	Range() (oldest, latest uint64)
}

// Event is one change in the life of a plugin on this node. Index grows
// by one with every event the node emits.
type Event struct {
	Index       uint64    `json:"index"`
	Time        time.Time `json:"time"`
	Type        EventType `json:"type"`
	PluginID    string    `json:"plugin_id"`
	Description string    `json:"description"`
	// VolumeID and WorkloadID are set on volume events only.
	VolumeID   string `json:"volume_id,omitempty"`
	WorkloadID string `json:"workload_id,omitempty"`
}

// Proto returns the event's API message, with every string made valid
// UTF-8 (WireString).
func (e Event) Proto() *csisupdv1.Event {
	return &csisupdv1.Event{
		Index:       e.Index,
		Time:        timestamppb.New(e.Time),
		Type:        WireString(string(e.Type)),
		PluginId:    WireString(e.PluginID),
		Description: WireString(e.Description),
		VolumeId:    WireString(e.VolumeID),
		WorkloadId:  WireString(e.WorkloadID),
	}
}
