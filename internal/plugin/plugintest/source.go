package plugintest

import (
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Source is a plugin.Source whose plugins a test sets, for tests of
// the consumers of plugin state (the node client, the servers) that need
// no plugin processes. It notifies its subscribers as the registry does:
// coalesced, one notification pending from the start.
type Source struct {
	mu      sync.Mutex
	plugins []*csisupdv1.Plugin
	subs    map[*sourceSub]struct{}
}

// NewSource returns a source holding plugins.
func NewSource(plugins ...*csisupdv1.Plugin) *Source {
	s := &Source{subs: make(map[*sourceSub]struct{})}
	s.Set(plugins...)
	return s
}

// Set replaces the plugins and notifies every subscriber.
func (s *Source) Set(plugins ...*csisupdv1.Plugin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plugins = clonePlugins(plugins)
	for sub := range s.subs {
		select {
		case sub.c <- struct{}{}:
		default:
		}
	}
}

// List returns copies of the plugins.
func (s *Source) List() []*csisupdv1.Plugin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return clonePlugins(s.plugins)
}

// Get returns a copy of one plugin.
func (s *Source) Get(id string) (*csisupdv1.Plugin, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.plugins, func(p *csisupdv1.Plugin) bool { return p.GetId() == id })
	if i < 0 {
		return nil, false
	}
	return proto.CloneOf(s.plugins[i]), true
}

// Ignored returns nothing: the source has no plugin directory.
func (s *Source) Ignored() []plugin.Ignored { return nil }

// Subscribe returns a coalesced change subscription.
func (s *Source) Subscribe() plugin.Subscription {
	sub := &sourceSub{src: s, c: make(chan struct{}, 1)}
	sub.c <- struct{}{}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return sub
}

type sourceSub struct {
	src *Source
	c   chan struct{}
}

func (s *sourceSub) C() <-chan struct{} { return s.c }

func (s *sourceSub) Close() {
	s.src.mu.Lock()
	delete(s.src.subs, s)
	s.src.mu.Unlock()
}

func clonePlugins(ps []*csisupdv1.Plugin) []*csisupdv1.Plugin {
	out := make([]*csisupdv1.Plugin, len(ps))
	for i, p := range ps {
		out[i] = proto.CloneOf(p)
	}
	return out
}
