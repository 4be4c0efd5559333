package fsm

import (
	"fmt"
	"slices"
	"testing"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// pagingFSM holds 25 nodes n00..n24: every node runs plugin "all", even
// nodes run "even", nodes 0, 3, 6, ... are down.
func pagingFSM(t *testing.T) *FSM {
	t.Helper()
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	var entries []*statepb.LogEntry
	for i := range 25 {
		id := fmt.Sprintf("n%02d", i)
		ps := []*statepb.Plugin{plug("all", string(plugin.TypeNode), true)}
		if i%2 == 0 {
			ps = append(ps, plug("even", string(plugin.TypeNode), true))
		}
		entries = append(entries, register(id, ps...), setStatus(id, state.NodeStatusReady))
		if i%3 == 0 {
			entries = append(entries, setStatus(id, state.NodeStatusDown))
		}
	}
	for _, r := range applyAll(t, f, entries...) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	return f
}

// allPages follows the next ids from the first page to the last and returns
// the ids in order and the number of pages.
func allPages(t *testing.T, page func(token string) ([]string, string, error)) ([]string, int) {
	t.Helper()
	var ids []string
	token, pages := "", 0
	for {
		got, next, err := page(token)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		ids = append(ids, got...)
		if next == "" {
			return ids, pages
		}
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		token = next
	}
}

func nodeIDs(want func(i int) bool) []string {
	var out []string
	for i := range 25 {
		if want(i) {
			out = append(out, fmt.Sprintf("n%02d", i))
		}
	}
	return out
}

func TestNodesPaging(t *testing.T) {
	st := pagingFSM(t).State()
	tests := []struct {
		name      string
		pageSize  uint32
		plugin    string
		status    string
		want      []string
		wantPages int
	}{
		{name: "all in one", want: nodeIDs(func(int) bool { return true }), wantPages: 1},
		{name: "pages of 10", pageSize: 10, want: nodeIDs(func(int) bool { return true }), wantPages: 3},
		{name: "page size equals count", pageSize: 25, want: nodeIDs(func(int) bool { return true }), wantPages: 1},
		{name: "pages of 1", pageSize: 1, want: nodeIDs(func(int) bool { return true }), wantPages: 25},
		{name: "plugin", pageSize: 4, plugin: "even", want: nodeIDs(func(i int) bool { return i%2 == 0 }), wantPages: 4},
		{name: "status down", pageSize: 3, status: state.NodeStatusDown, want: nodeIDs(func(i int) bool { return i%3 == 0 }), wantPages: 3},
		{name: "status ready", status: state.NodeStatusReady, want: nodeIDs(func(i int) bool { return i%3 != 0 }), wantPages: 1},
		{name: "plugin and status", pageSize: 2, plugin: "even", status: state.NodeStatusDown,
			want: nodeIDs(func(i int) bool { return i%6 == 0 }), wantPages: 3},
		{name: "unknown plugin", pageSize: 5, plugin: "nope", want: nil, wantPages: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, pages := allPages(t, func(token string) ([]string, string, error) {
				nodes, next := st.NodesPage(token, int(tt.pageSize), state.NodeFilter(tt.plugin, tt.status, (*statepb.ClusterNode).GetStatus))
				if tt.pageSize > 0 && len(nodes) > int(tt.pageSize) {
					t.Fatalf("page of %d nodes, page size %d", len(nodes), tt.pageSize)
				}
				var ids []string
				for _, n := range nodes {
					ids = append(ids, n.GetId())
				}
				return ids, next, nil
			})
			if !slices.Equal(got, tt.want) {
				t.Fatalf("nodes %v, want %v", got, tt.want)
			}
			if pages != tt.wantPages {
				t.Fatalf("%d pages, want %d", pages, tt.wantPages)
			}
		})
	}
}

func TestPluginsPagingKeepsInstancesTogether(t *testing.T) {
	f := pagingFSM(t)
	// Three more plugins, on several nodes each: a page must never split a
	// plugin's instances.
	applyAll(t, f, setPlugins("n01", plug("all", string(plugin.TypeNode), true), plug("b", string(plugin.TypeNode), true), plug("c", string(plugin.TypeMonolith), true)),
		setPlugins("n05", plug("all", string(plugin.TypeNode), true), plug("b", string(plugin.TypeNode), true), plug("c", string(plugin.TypeMonolith), true)))
	st := f.State()
	var instances []int
	got, pages := allPages(t, func(token string) ([]string, string, error) {
		plugins, next := st.PluginsPage(token, 1)
		var ids []string
		for _, pl := range plugins {
			ids = append(ids, pl.ID)
			instances = append(instances, len(pl.Instances))
		}
		return ids, next, nil
	})
	if want := []string{"all", "b", "c", "even"}; !slices.Equal(got, want) || pages != 4 {
		t.Fatalf("plugins %v in %d pages, want %v in 4", got, pages, want)
	}
	if want := []int{25, 2, 2, 13}; !slices.Equal(instances, want) {
		t.Fatalf("instances per plugin %v, want %v", instances, want)
	}
}

func TestPagingResumesAfterConcurrentWrites(t *testing.T) {
	f := pagingFSM(t)
	st := f.State()
	first, next := st.NodesPage("", 10, nil)
	if len(first) != 10 || next != "n10" {
		t.Fatalf("first page %d nodes, next %q", len(first), next)
	}
	// Nodes registered between the pages, one before the cursor and one
	// after it: the next page neither repeats a node nor skips one.
	applyAll(t, f, register("n00a"), register("n10a"))
	second, _ := f.State().NodesPage(next, 3, nil)
	var ids []string
	for _, n := range second {
		ids = append(ids, n.GetId())
	}
	if want := []string{"n10", "n10a", "n11"}; !slices.Equal(ids, want) {
		t.Fatalf("second page %v, want %v", ids, want)
	}
}
