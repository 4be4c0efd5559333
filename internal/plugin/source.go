package plugin

import csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"

// Source is read access to the plugins of one node. The registry
// implements it; the Agent API, the node client and the Consul sync read
// plugin state only through it. Every method is safe for concurrent use
// and returns values the caller owns.
type Source interface {
	// List returns the read model of every plugin, sorted by id: those
	// supervised, and the required ones that have no socket yet (health
	// state "missing").
	List() []*csisupdv1.Plugin
	// Get returns the read model of one plugin, and false when no plugin
	// has that id.
	Get(id string) (*csisupdv1.Plugin, bool)
	// Ignored returns the sockets that are not supervised, with why:
	// entries of the plugin directory, declared sockets and kubelet
	// registration sockets.
	Ignored() []Ignored
	// Subscribe returns a subscription to changes. Changes are coalesced:
	// however many happen while the subscriber is busy, it sees one
	// pending notification and then reads the latest state with List. One
	// notification is pending from the start, so a subscriber reads the
	// initial state without a special case.
	Subscribe() Subscription
}

// Subscription delivers coalesced change notifications of a Source. A
// subscriber never slows the Source down.
type Subscription interface {
	// C receives a value after every change (coalesced).
	C() <-chan struct{}
	// Close stops the notifications.
	Close()
}

// Ignored is a socket (or plugin directory entry) that is not supervised,
// with why.
type Ignored struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}
