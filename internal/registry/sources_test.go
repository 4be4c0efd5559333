package registry

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/plugin"
)

func TestMergeClaims(t *testing.T) {
	inst := func(path string, inode uint64) plugin.Instance { return plugin.Instance{Path: path, Inode: inode} }
	declared := func(id, path string, inode uint64) claim {
		return claim{kind: sourceDeclared, id: id, path: path, inst: inst(path, inode)}
	}
	kubelet := func(id, path string, inode uint64) claim {
		return claim{kind: sourceKubelet, id: id, path: path, inst: inst(path, inode), registration: "/reg/" + id + "-reg.sock"}
	}
	discovered := func(id, path string, inode uint64) claim {
		return claim{kind: sourceDiscovered, id: id, path: path, inst: inst(path, inode)}
	}
	missing := func(c claim) claim {
		c.inst, c.absent = plugin.Instance{}, "the "+c.kind.String()+" "+c.path+": does not exist"
		return c
	}

	shadowed := func(c claim) claim { c.shadowed = true; return c }
	inUse := func(path string) holding { return holding{path: path, inUse: true} }
	idle := func(path string) holding { return holding{path: path} }

	tests := []struct {
		name      string
		claims    []claim
		held      map[string]holding
		sockets   map[string]string // id -> supervised path
		absent    []string          // ids held by a claim without a socket
		conflicts []string          // "id: winner path > loser path"
		shared    int
		ignored   []string // paths
	}{
		{
			name:    "one source each",
			claims:  []claim{declared("a", "/run/a.sock", 1), kubelet("b", "/k/b.sock", 2), discovered("c", "/p/c/csi.sock", 3)},
			sockets: map[string]string{"a": "/run/a.sock", "b": "/k/b.sock", "c": "/p/c/csi.sock"},
		},
		{
			name:      "declared beats discovered",
			claims:    []claim{discovered("a", "/p/a/csi.sock", 1), declared("a", "/run/a.sock", 2)},
			sockets:   map[string]string{"a": "/run/a.sock"},
			conflicts: []string{"a: /run/a.sock > /p/a/csi.sock"},
			ignored:   []string{"/p/a/csi.sock"},
		},
		{
			name:      "declared beats kubelet",
			claims:    []claim{kubelet("a", "/k/a.sock", 1), declared("a", "/run/a.sock", 2)},
			sockets:   map[string]string{"a": "/run/a.sock"},
			conflicts: []string{"a: /run/a.sock > /k/a.sock"},
			ignored:   []string{"/reg/a-reg.sock"},
		},
		{
			name:      "kubelet beats discovered",
			claims:    []claim{discovered("a", "/p/a.sock", 1), kubelet("a", "/k/a.sock", 2)},
			sockets:   map[string]string{"a": "/k/a.sock"},
			conflicts: []string{"a: /k/a.sock > /p/a.sock"},
			ignored:   []string{"/p/a.sock"},
		},
		{
			name:      "all three: one plugin, two conflicts",
			claims:    []claim{discovered("a", "/p/a.sock", 1), kubelet("a", "/k/a.sock", 2), declared("a", "/run/a.sock", 3)},
			sockets:   map[string]string{"a": "/run/a.sock"},
			conflicts: []string{"a: /run/a.sock > /k/a.sock", "a: /run/a.sock > /p/a.sock"},
			ignored:   []string{"/p/a.sock", "/reg/a-reg.sock"},
		},
		{
			name:      "a plugin in use keeps its socket against a kubelet registration",
			claims:    []claim{discovered("a", "/p/a.sock", 1), kubelet("a", "/k/a.sock", 2)},
			held:      map[string]holding{"a": inUse("/p/a.sock")},
			sockets:   map[string]string{"a": "/p/a.sock"},
			conflicts: []string{"a: /p/a.sock > /k/a.sock (in use)"},
			ignored:   []string{"/reg/a-reg.sock"},
		},
		{
			name:      "a plugin in use keeps its socket against a declaration",
			claims:    []claim{kubelet("a", "/k/a.sock", 1), declared("a", "/run/a.sock", 2)},
			held:      map[string]holding{"a": inUse("/k/a.sock")},
			sockets:   map[string]string{"a": "/k/a.sock"},
			conflicts: []string{"a: /k/a.sock > /run/a.sock (in use)"},
			ignored:   []string{"/run/a.sock"},
		},
		{
			name:      "a plugin not in use gives way to the order of the sources",
			claims:    []claim{discovered("a", "/p/a.sock", 1), kubelet("a", "/k/a.sock", 2)},
			held:      map[string]holding{"a": idle("/p/a.sock")},
			sockets:   map[string]string{"a": "/k/a.sock"},
			conflicts: []string{"a: /k/a.sock > /p/a.sock"},
			ignored:   []string{"/p/a.sock"},
		},
		{
			name:      "a holder that wins by order too is a conflict by order",
			claims:    []claim{declared("a", "/run/a.sock", 1), discovered("a", "/p/a.sock", 2)},
			held:      map[string]holding{"a": inUse("/run/a.sock")},
			sockets:   map[string]string{"a": "/run/a.sock"},
			conflicts: []string{"a: /run/a.sock > /p/a.sock"},
			ignored:   []string{"/p/a.sock"},
		},
		{
			name:      "the id of a plugin in use whose socket is gone is held by nobody",
			claims:    []claim{kubelet("a", "/k/a.sock", 2)},
			held:      map[string]holding{"a": inUse("/p/a.sock")},
			sockets:   map[string]string{},
			absent:    []string{"a"},
			conflicts: []string{"a: /p/a.sock > /k/a.sock (in use)"},
			ignored:   []string{"/reg/a-reg.sock"},
		},
		{
			name:    "a plugin that is gone and not in use frees its id",
			claims:  []claim{kubelet("a", "/k/a.sock", 2)},
			held:    map[string]holding{"a": idle("/p/a.sock")},
			sockets: map[string]string{"a": "/k/a.sock"},
		},
		{
			name:      "a registration of a socket serving another id is refused",
			claims:    []claim{discovered("a", "/p/a.sock", 1), kubelet("b", "/p/a.sock", 1)},
			held:      map[string]holding{"a": idle("/p/a.sock")},
			sockets:   map[string]string{"a": "/p/a.sock"},
			conflicts: []string{"a: /p/a.sock > /p/a.sock (socket b)"},
			ignored:   []string{"/reg/b-reg.sock"},
		},
		{
			name:      "a declaration of a socket serving another id is refused",
			claims:    []claim{kubelet("a", "/k/a.sock", 1), declared("b", "/k/a.sock", 1)},
			held:      map[string]holding{"a": inUse("/k/a.sock")},
			sockets:   map[string]string{"a": "/k/a.sock"},
			conflicts: []string{"a: /k/a.sock > /k/a.sock (socket b)"},
			ignored:   []string{"/k/a.sock"},
		},
		{
			name:      "an <id>/csi.sock comes before a shadowed <id>.sock",
			claims:    []claim{shadowed(discovered("a", "/p/a.sock", 1)), discovered("a", "/p/a/csi.sock", 2)},
			sockets:   map[string]string{"a": "/p/a/csi.sock"},
			conflicts: []string{"a: /p/a/csi.sock > /p/a.sock"},
			ignored:   []string{"/p/a.sock"},
		},
		{
			name:      "a shadowed <id>.sock in use keeps its id",
			claims:    []claim{shadowed(discovered("a", "/p/a.sock", 1)), discovered("a", "/p/a/csi.sock", 2)},
			held:      map[string]holding{"a": inUse("/p/a.sock")},
			sockets:   map[string]string{"a": "/p/a.sock"},
			conflicts: []string{"a: /p/a.sock > /p/a/csi.sock (in use)"},
			ignored:   []string{"/p/a/csi.sock"},
		},
		{
			name:      "two registrations of one socket under two ids: the first kind, then the smaller id",
			claims:    []claim{kubelet("b", "/k/x.sock", 1), kubelet("a", "/k/x.sock", 1)},
			sockets:   map[string]string{"a": "/k/x.sock"},
			conflicts: []string{"a: /k/x.sock > /k/x.sock (socket b)"},
			ignored:   []string{"/reg/b-reg.sock"},
		},
		{
			name:    "the declaration holds its id while its socket is absent",
			claims:  []claim{discovered("a", "/p/a.sock", 1), missing(declared("a", "/run/a.sock", 0))},
			sockets: map[string]string{},
			absent:  []string{"a"},
			conflicts: []string{
				"a: /run/a.sock > /p/a.sock",
			},
			ignored: []string{"/p/a.sock"},
		},
		{
			name:    "one socket named by two sources is one plugin",
			claims:  []claim{discovered("a", "/p/a/csi.sock", 1), declared("a", "/p/a/csi.sock", 1)},
			sockets: map[string]string{"a": "/p/a/csi.sock"},
			shared:  1,
		},
		{
			name:    "a discovered socket declared under another id is that plugin only",
			claims:  []claim{discovered("b", "/p/b/csi.sock", 1), declared("a", "/p/b/csi.sock", 1)},
			sockets: map[string]string{"a": "/p/b/csi.sock"},
			ignored: []string{"/p/b/csi.sock"},
		},
		{
			name:      "two kubelet registrations of one driver: the smaller path wins",
			claims:    []claim{kubelet("a", "/k2/a.sock", 2), kubelet("a", "/k1/a.sock", 1)},
			sockets:   map[string]string{"a": "/k1/a.sock"},
			conflicts: []string{"a: /k1/a.sock > /k2/a.sock"},
			ignored:   []string{"/reg/a-reg.sock"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The outcome does not depend on the order of the claims.
			for _, claims := range [][]claim{tt.claims, reversed(tt.claims)} {
				m := mergeClaims(slices.Clone(claims), tt.held)
				got := map[string]string{}
				for id, si := range m.sockets {
					got[id] = si.Path
				}
				if !maps.Equal(got, tt.sockets) {
					t.Errorf("sockets = %v, want %v", got, tt.sockets)
				}
				var absent []string
				for id := range m.absent {
					absent = append(absent, id)
				}
				slices.Sort(absent)
				if !slices.Equal(absent, tt.absent) {
					t.Errorf("absent = %v, want %v", absent, tt.absent)
				}
				var conflicts []string
				for _, c := range m.conflicts {
					s := c.winner.id + ": " + c.winner.path + " > " + c.loser.path
					d := c.description()
					switch c.kind {
					case byHolder:
						s += " (in use)"
					case bySocket:
						s += " (socket " + c.loser.id + ")"
						if !strings.Contains(d, strconv.Quote(c.winner.id)) || !strings.Contains(d, strconv.Quote(c.loser.id)) {
							t.Errorf("socket conflict description %q does not name both ids", d)
						}
					}
					conflicts = append(conflicts, s)
					if !strings.Contains(d, c.winner.path) || !strings.Contains(d, c.loser.path) {
						t.Errorf("conflict description %q does not name both paths", d)
					}
				}
				slices.Sort(conflicts)
				if !slices.Equal(conflicts, tt.conflicts) {
					t.Errorf("conflicts = %v, want %v", conflicts, tt.conflicts)
				}
				if len(m.shared) != tt.shared {
					t.Errorf("shared = %d, want %d", len(m.shared), tt.shared)
				}
				var ignored []string
				for _, ig := range m.ignored {
					ignored = append(ignored, ig.Path)
				}
				if !slices.Equal(ignored, tt.ignored) {
					t.Errorf("ignored = %v, want %v", ignored, tt.ignored)
				}
			}
		})
	}
}

func reversed[T any](s []T) []T {
	out := slices.Clone(s)
	slices.Reverse(out)
	return out
}
