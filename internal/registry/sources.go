package registry

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csisupd/csisupd/internal/plugin"
)

// sourceKind is where a claim on a plugin id comes from. The order of the
// constants is the precedence: when two sources claim one id at once, the
// first wins, so the choice is the same after a restart. It decides only
// between claims that meet with nobody holding the id: a plugin in use
// keeps its socket (see mergeClaims).
type sourceKind int

const (
	// sourceDeclared is a plugin block's socket.
	sourceDeclared sourceKind = iota
	// sourceKubelet is the endpoint a kubelet registration socket named.
	sourceKubelet
	// sourceDiscovered is a socket in the plugin directory.
	sourceDiscovered
	// sourceHeld is no source: it stands for the socket of a registered
	// plugin that no claim names any more (it is gone, and the plugin is
	// deregistered after the grace period).
	sourceHeld
)

func (k sourceKind) String() string {
	switch k {
	case sourceDeclared:
		return "declared socket"
	case sourceKubelet:
		return "kubelet-registered endpoint"
	case sourceDiscovered:
		return "socket in the plugin directory"
	default:
		return "registered plugin's socket"
	}
}

// claim is one source's claim on a plugin id: the socket path it names,
// and the socket's identity when it is there and trusted.
type claim struct {
	kind sourceKind
	id   string
	path string
	// inst is the socket's identity; valid when absent is "".
	inst plugin.Instance
	// absent says why the socket cannot be supervised: it does not exist,
	// is not a socket, or is not trusted. "" when it can be.
	absent string
	// registration is the kubelet registration socket of a sourceKubelet
	// claim.
	registration string
	// shadowed marks a discovered <id>.sock beside an <id>/csi.sock: it
	// comes after the other in the order of the sources.
	shadowed bool
}

// shownPath is where a claim is listed as ignored: a kubelet claim at its
// registration socket, the one its registrar serves; any other at its
// socket.
func (c claim) shownPath() string {
	if c.kind == sourceKubelet && c.registration != "" {
		return c.registration
	}
	return c.path
}

// holding is what the registry holds for a plugin id when claims are
// merged: its record's socket, and whether the plugin is in use.
type holding struct {
	path string
	// inUse is true while the plugin is healthy or has volumes on this
	// node: its id then never moves to another socket.
	inUse bool
}

// conflictKind tells why a claim lost.
type conflictKind int

const (
	// byOrder: two claims met with nobody holding the id; the order of
	// the sources decided.
	byOrder conflictKind = iota
	// byHolder: the id is held by a plugin in use at another socket.
	byHolder
	// bySocket: the claim names a socket that serves another plugin id.
	bySocket
)

// conflict is a claim that lost to another: its plugin id to a claim at a
// different path, or its socket to a claim of another id.
type conflict struct {
	kind          conflictKind
	winner, loser claim
}

// description names both paths (both ids for a socket conflict), which
// one is supervised and why, for the plugin-conflict event, the log and a
// losing registrar.
func (c conflict) description() string {
	w, l := c.winner, c.loser
	switch c.kind {
	case byHolder:
		return fmt.Sprintf("plugin id %q is held by the %s %s, which is in use (healthy, or with volumes on this node); "+
			"the %s %s is refused: a plugin id in use never moves to another socket. The id is free again once "+
			"%s has been gone for deregister_grace", w.id, w.kind, w.path, l.kind, l.path, w.path)
	case bySocket:
		return fmt.Sprintf("socket %s serves plugin %q; the %s naming it as plugin %q is refused: "+
			"one socket serves one plugin id", w.path, w.id, l.kind, l.id)
	default:
		return fmt.Sprintf("plugin id %q is claimed by the %s %s and by the %s %s; supervising the %s "+
			"(when claims meet, declared sockets win, then kubelet registrations, then the plugin directory)",
			w.id, w.kind, w.path, l.kind, l.path, w.kind)
	}
}

// merged is the outcome of mergeClaims.
type merged struct {
	// sockets are the plugins to supervise.
	sockets map[string]plugin.Instance
	// winners is the claim that holds each plugin id, socket or not.
	winners map[string]claim
	// absent says, for every id whose winning claim's socket cannot be
	// supervised, why.
	absent map[string]string
	// conflicts are the claims that lost to another at a different path,
	// or to another id at the same path, sorted by id and path.
	conflicts []conflict
	// shared are the claims that lost to another of the same id at the
	// same path: one socket, named by two sources; one plugin.
	shared []conflict
	// ignored lists what is not supervised because another claim won.
	ignored []plugin.Ignored
}

// mergeClaims decides which claim holds each plugin id, given what the
// registry holds (held, by id):
//
//   - one socket serves one id: a socket that a registered plugin's record
//     names keeps that id (while a claim of that id still names it, or
//     the plugin is in use); another socket goes to the claim of the
//     first source kind, then of the smaller id. A discovered socket that
//     loses so is not a plugin of its own; a declaration or a
//     registration that loses so is a conflict;
//   - an id held by a plugin in use (healthy, or with volumes on this
//     node) stays at its record's socket, whatever claims appear; while
//     that socket is gone (deregistration pending) nobody holds it;
//   - otherwise the claim of the first source kind (declared, kubelet,
//     discovered) holds it, and between two of one kind the one of the
//     smaller path.
func mergeClaims(claims []claim, held map[string]holding) merged {
	m := merged{
		sockets: make(map[string]plugin.Instance),
		winners: make(map[string]claim),
		absent:  make(map[string]string),
	}
	claims = m.oneIDPerSocket(claims, held)
	slices.SortFunc(claims, func(a, b claim) int {
		return cmp.Or(strings.Compare(a.id, b.id), cmp.Compare(a.kind, b.kind), compareBool(a.shadowed, b.shadowed),
			strings.Compare(a.path, b.path))
	})
	for i := 0; i < len(claims); {
		j := i + 1
		for j < len(claims) && claims[j].id == claims[i].id {
			j++
		}
		m.decide(claims[i:j], held)
		i = j
	}
	for id, w := range m.winners {
		if w.absent != "" {
			m.absent[id] = w.absent
			continue
		}
		m.sockets[id] = w.inst
	}
	slices.SortFunc(m.conflicts, func(a, b conflict) int {
		return cmp.Or(strings.Compare(a.loser.id, b.loser.id), strings.Compare(a.loser.path, b.loser.path))
	})
	slices.SortFunc(m.ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) })
	return m
}

// precedes reports whether claim a comes before b in the order of the
// sources (same id).
func precedes(a, b claim) bool {
	return cmp.Or(cmp.Compare(a.kind, b.kind), compareBool(a.shadowed, b.shadowed), strings.Compare(a.path, b.path)) < 0
}

// compareBool orders false before true.
func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

// oneIDPerSocket drops the claims that name a socket serving another id
// (see mergeClaims) and returns the others.
func (m *merged) oneIDPerSocket(claims []claim, held map[string]holding) []claim {
	named := make(map[[2]string]bool, len(claims))
	for _, c := range claims {
		named[[2]string{c.id, c.path}] = true
	}
	server := make(map[string]claim) // socket path -> the claim it serves
	for id, h := range held {
		if h.path != "" && (h.inUse || named[[2]string{id, h.path}]) {
			server[h.path] = claim{kind: sourceHeld, id: id, path: h.path}
		}
	}
	byKind := slices.Clone(claims)
	slices.SortFunc(byKind, func(a, b claim) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), strings.Compare(a.id, b.id), strings.Compare(a.path, b.path))
	})
	for _, c := range byKind {
		if s, ok := server[c.path]; !ok || (s.kind == sourceHeld && s.id == c.id) {
			server[c.path] = c
		}
	}
	kept := make([]claim, 0, len(claims))
	for _, c := range claims {
		s := server[c.path]
		switch {
		case s.id == c.id:
			kept = append(kept, c)
		case c.kind == sourceDiscovered:
			m.ignored = append(m.ignored, plugin.Ignored{Path: c.path, Reason: fmt.Sprintf(
				"this socket serves plugin %q (the %s); one socket serves one plugin id", s.id, s.kind)})
		default:
			cf := conflict{kind: bySocket, winner: s, loser: c}
			m.conflicts = append(m.conflicts, cf)
			m.ignored = append(m.ignored, plugin.Ignored{Path: c.shownPath(), Reason: cf.description()})
		}
	}
	return kept
}

// decide picks the claim that holds one id among cs, its claims sorted by
// kind and path (see mergeClaims).
func (m *merged) decide(cs []claim, held map[string]holding) {
	id := cs[0].id
	w := cs[0]
	kind := byOrder
	if h, ok := held[id]; ok && h.inUse {
		kind = byHolder
		i := slices.IndexFunc(cs, func(c claim) bool { return c.path == h.path })
		if i >= 0 {
			w = cs[i]
		} else {
			w = claim{kind: sourceHeld, id: id, path: h.path, absent: fmt.Sprintf(
				"its socket %s is gone; the id stays held until the plugin is deregistered after deregister_grace", h.path)}
		}
	}
	m.winners[id] = w
	if w.kind == sourceHeld {
		delete(m.winners, id)
		m.absent[id] = w.absent
	}
	for _, c := range cs {
		switch {
		case c == w:
		case c.path == w.path:
			m.shared = append(m.shared, conflict{kind: kind, winner: w, loser: c})
		default:
			k := kind
			if k == byHolder && w.kind != sourceHeld && precedes(w, c) {
				// The holder wins by order too: say so, so that the
				// description stays the same whether it is in use or not.
				k = byOrder
			}
			cf := conflict{kind: k, winner: w, loser: c}
			m.conflicts = append(m.conflicts, cf)
			m.ignored = append(m.ignored, plugin.Ignored{Path: c.shownPath(), Reason: cf.description()})
		}
	}
}

// inspectNamedSocket looks at a socket that a declaration or a kubelet
// registration names, with lstat and the trust rules of the plugin
// directory's sockets: no symlink, neither as the socket nor as a parent
// directory, a socket (a FIFO, file, device or directory there is
// refused, never opened), and an allowed owner. It returns the socket's identity, or why it cannot be
// supervised (without the path) and whether that is a refusal, reported by
// a plugin-socket-ignored event, rather than an absence.
func (p trustPolicy) inspectNamedSocket(path string) (inst plugin.Instance, why string, refused bool) {
	dir := filepath.Dir(path)
	real, err := filepath.EvalSymlinks(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return plugin.Instance{}, "does not exist (no directory " + dir + ")", false
	case err != nil:
		return plugin.Instance{}, err.Error(), false
	case real != dir:
		return plugin.Instance{}, fmt.Sprintf("a directory on its path is a symlink (it resolves to %s); "+
			"symlinks are never followed: name the socket by its real path", filepath.Join(real, filepath.Base(path))), true
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return plugin.Instance{}, "does not exist", false
	case err != nil:
		return plugin.Instance{}, "cannot stat: " + err.Error(), false
	case fi.Mode().Type() == fs.ModeSymlink:
		return plugin.Instance{}, "is a symlink; symlinks are never followed: name the socket by its real path", true
	case fi.Mode().Type() != fs.ModeSocket:
		// Named, so expected to be a socket: something else there is a
		// mistake to report, and is never opened or dialled.
		return plugin.Instance{}, fmt.Sprintf("not a unix socket (%s); nothing is dialled there until a socket replaces it",
			describeMode(fi.Mode().Type())), true
	}
	inst, reason, refused, err := p.trustedSocket(path, fi)
	if err != nil {
		return plugin.Instance{}, err.Error(), false
	}
	return inst, reason, refused
}

// namedClaim is the claim of a declaration or a kubelet registration on
// plugin id at the socket path, and the refusal to report when the socket
// is not trusted.
func (p trustPolicy) namedClaim(kind sourceKind, id, path string) (claim, *refusal) {
	c := claim{kind: kind, id: id, path: path}
	inst, why, refused := p.inspectNamedSocket(path)
	if why == "" {
		c.inst = inst
		return c, nil
	}
	c.absent = fmt.Sprintf("the %s %s: %s", kind, path, why)
	if refused {
		c.absent = fmt.Sprintf("the %s %s is not trusted: %s", kind, path, why)
	}
	if !refused {
		return c, nil
	}
	return c, &refusal{ID: id, Path: path, Reason: why}
}
