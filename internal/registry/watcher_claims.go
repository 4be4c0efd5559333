package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csisupd/csisupd/internal/plugin"
)

// addClaims turns the plugin directory's scan st into the desired state of
// every source: the declared sockets and the kubelet registrations claim
// their plugin ids too, and mergeClaims decides which claim holds each id.
// It reports what changed since the previous scan (conflicts, untrusted
// sockets), tells the registry why required plugins have no socket, and
// watches the directories the claims name.
func (w *watcher) addClaims(st *desiredState) {
	decls := w.cfg.Registry.declarations()
	claims := make([]claim, 0, len(st.Sockets)+len(decls))
	for id, si := range st.Sockets {
		claims = append(claims, claim{kind: sourceDiscovered, id: id, path: si.Path, inst: si})
	}
	// An <id>.sock that holds its id keeps claiming it when an
	// <id>/csi.sock appears beside it: no live takeover there either.
	for id, si := range st.Shadowed {
		if p, ok := w.cfg.Registry.Get(id); ok && p.Instance.Path == si.Path {
			claims = append(claims, claim{kind: sourceDiscovered, id: id, path: si.Path, inst: si, shadowed: true})
			st.Ignored = slices.DeleteFunc(st.Ignored, func(i plugin.Ignored) bool { return i.Path == si.Path })
		}
	}
	st.Expect = make(map[string]plugin.Type)
	var dirs []string
	refuse := func(r *refusal) {
		if r != nil {
			st.Refused = append(st.Refused, *r)
			st.Ignored = append(st.Ignored, plugin.Ignored{Path: r.Path, Reason: r.Reason})
		}
	}
	for id, d := range decls {
		if d.Type != "" {
			st.Expect[id] = d.Type
		}
		if d.Socket == "" {
			continue
		}
		c, r := w.cfg.Trust.namedClaim(sourceDeclared, id, d.Socket)
		claims = append(claims, c)
		refuse(r)
		dirs = append(dirs, filepath.Dir(d.Socket))
	}
	if k := w.cfg.Kubelet; k != nil {
		found, ignored, refused, err := k.scan()
		if err != nil {
			// The registrations keep their last state; the next scan
			// tries again.
			w.log.Error("cannot scan the kubelet registration directory", "error", err)
		} else {
			k.observe(w.ctx, found)
		}
		st.Ignored = append(st.Ignored, ignored...)
		st.Refused = append(st.Refused, refused...)
		kclaims, kignored, krefused, pending := k.claims()
		w.registrationsPending = pending
		claims = append(claims, kclaims...)
		st.Ignored = append(st.Ignored, kignored...)
		st.Refused = append(st.Refused, krefused...)
		dirs = append(append(dirs, k.cfg.Dir), k.endpointDirs()...)
	}

	m := mergeClaims(claims, w.holdings(claims))
	st.Sockets = m.sockets
	st.Ignored = append(st.Ignored, m.ignored...)
	slices.SortFunc(st.Ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) })
	st.Refused = sortedRefusals(st.Refused)

	absent := make(map[string]string)
	for id, d := range decls {
		if !d.Required {
			continue
		}
		if _, ok := m.sockets[id]; ok {
			continue
		}
		why, ok := m.absent[id]
		if !ok {
			why = fmt.Sprintf("no socket at %s or %s, and no kubelet registration names it",
				filepath.Join(w.cfg.Dir, id, SocketName), filepath.Join(w.cfg.Dir, id+SocketSuffix))
		}
		absent[id] = why
	}
	w.cfg.Registry.setAbsent(absent)
	w.reportConflicts(m)
	w.watchExtra(dirs)
}

// holdings returns what the registry holds for each plugin id, for
// mergeClaims: its record's socket, and whether it is in use. A plugin
// whose socket is still there but named by no source any more (its
// declaration moved or went away: the operator's decision) is not in use:
// the id goes where the sources say. Whether a plugin has volumes on this
// node (InUse) is asked only of one that is not healthy and that a claim
// names at another socket.
func (w *watcher) holdings(claims []claim) map[string]holding {
	recs := w.cfg.Registry.List()
	paths := make(map[string]string, len(recs))
	for _, p := range recs {
		paths[p.ID] = p.Instance.Path
	}
	named := make(map[string]bool, len(claims))
	contested := make(map[string]bool)
	for _, c := range claims {
		named[c.path] = true
		if path, ok := paths[c.id]; ok && path != c.path {
			contested[c.id] = true
		}
	}
	held := make(map[string]holding, len(recs))
	for _, p := range recs {
		h := holding{path: p.Instance.Path, inUse: p.Healthy()}
		switch {
		case !named[h.path] && socketThere(h.path):
			h.inUse = false
		case !h.inUse && contested[p.ID] && w.cfg.InUse != nil:
			h.inUse = w.cfg.InUse(p.ID)
		}
		held[p.ID] = h
	}
	return held
}

// socketThere reports whether a socket file is at path.
func socketThere(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}

// reportConflicts emits plugin-conflict for every conflict that is new
// since the previous scan, under the plugin id that was refused, logs it
// naming both sockets, and tells a losing kubelet registration; a socket
// claimed by two sources under one id is logged once.
func (w *watcher) reportConflicts(m merged) {
	next := make(map[string]string, len(m.conflicts))
	for _, c := range m.conflicts {
		key := c.loser.id + "\x00" + c.loser.path
		desc := c.description()
		next[key] = desc
		if w.conflicts[key] != desc {
			w.log.Warn("plugin conflict", "plugin", c.loser.id, "holder", c.winner.id, "supervised", c.winner.path,
				"refused", c.loser.path, "source", c.loser.kind.String(), "description", desc)
			w.cfg.Registry.emitConflict(c.loser.id, desc)
		}
		if c.loser.kind == sourceKubelet && w.cfg.Kubelet != nil {
			w.cfg.Kubelet.lose(c.loser.registration, desc)
		}
	}
	w.conflicts = next
	shared := make(map[string]bool, len(m.shared))
	for _, c := range m.shared {
		key := c.loser.id + "\x00" + c.loser.kind.String()
		shared[key] = true
		if !w.shared[key] {
			w.log.Info("plugin socket is named by two sources; one plugin, the first source holds it",
				"plugin", c.winner.id, "socket", c.winner.path, "holder", c.winner.kind.String(), "also", c.loser.kind.String())
		}
	}
	w.shared = shared
}

// watchExtra watches the directories of dirs outside the plugin directory,
// each by its nearest existing ancestor while it does not exist (so that
// its creation triggers a scan), and stops watching those no longer named.
func (w *watcher) watchExtra(dirs []string) {
	want := make(map[string]bool, len(dirs))
	for _, d := range dirs {
		if d = existingAncestor(d); d != "" && d != w.cfg.Dir && !w.subdir[d] {
			want[d] = true
		}
	}
	for _, d := range slices.Sorted(maps.Keys(want)) {
		if w.extra[d] {
			continue
		}
		if err := w.fsw.Add(d); err != nil {
			// The periodic rescan still sees the socket.
			w.log.Warn("cannot watch a plugin socket's directory", "dir", d, "error", err)
			continue
		}
		w.extra[d] = true
	}
	for d := range w.extra {
		if !want[d] {
			_ = w.fsw.Remove(d) // fails when the kernel already dropped it
			delete(w.extra, d)
		}
	}
}

// existingAncestor returns dir, or its nearest ancestor that exists as a
// directory; "" when none can be found.
func existingAncestor(dir string) string {
	for {
		fi, err := os.Stat(dir)
		if err == nil && fi.IsDir() {
			return dir
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// sortedRefusals sorts refusals by path, as the watcher reports them.
func sortedRefusals(rs []refusal) []refusal {
	slices.SortFunc(rs, func(a, b refusal) int { return strings.Compare(a.Path, b.Path) })
	return rs
}
