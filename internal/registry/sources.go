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
// constants is the precedence: when two sources claim one id, the first
// wins, whatever sockets exist, so the choice is the same after a restart.
type sourceKind int

const (
	// sourceDeclared is a plugin block's socket.
	sourceDeclared sourceKind = iota
	// sourceKubelet is the endpoint a kubelet registration socket named.
	sourceKubelet
	// sourceDiscovered is a socket in the plugin directory.
	sourceDiscovered
)

func (k sourceKind) String() string {
	switch k {
	case sourceDeclared:
		return "declared socket"
	case sourceKubelet:
		return "kubelet-registered endpoint"
	default:
		return "socket in the plugin directory"
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
}

// conflict is a claim that lost its plugin id to another at a different
// path.
type conflict struct {
	winner, loser claim
}

// description names both paths and the one supervised, for the
// plugin-conflict event and the log.
func (c conflict) description() string {
	return fmt.Sprintf("plugin id %q is claimed by the %s %s and by the %s %s; supervising the %s "+
		"(declared sockets win, then kubelet registrations, then the plugin directory)",
		c.winner.id, c.winner.kind, c.winner.path, c.loser.kind, c.loser.path, c.winner.kind)
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
	// sorted by id and path.
	conflicts []conflict
	// shared are the claims that lost to another of the same id at the
	// same path: one socket, named by two sources; one plugin.
	shared []conflict
	// ignored lists what is not supervised because another claim won.
	ignored []plugin.Ignored
}

// mergeClaims decides which claim holds each plugin id: the one of the
// first source kind (declared, kubelet, discovered), and between two of one
// kind the one of the smaller path. A discovered socket that a declared or
// kubelet-registered claim names under another id is not a plugin of its
// own: one socket is one plugin.
func mergeClaims(claims []claim) merged {
	slices.SortFunc(claims, func(a, b claim) int {
		return cmp.Or(strings.Compare(a.id, b.id), cmp.Compare(a.kind, b.kind), strings.Compare(a.path, b.path))
	})
	m := merged{
		sockets: make(map[string]plugin.Instance),
		winners: make(map[string]claim),
		absent:  make(map[string]string),
	}
	for _, c := range claims {
		w, taken := m.winners[c.id]
		switch {
		case !taken:
			m.winners[c.id] = c
		case w.path == c.path:
			m.shared = append(m.shared, conflict{winner: w, loser: c})
		default:
			m.conflicts = append(m.conflicts, conflict{winner: w, loser: c})
			m.ignored = append(m.ignored, plugin.Ignored{Path: c.path, Reason: fmt.Sprintf(
				"plugin id %q is held by the %s %s", c.id, w.kind, w.path)})
		}
	}
	named := make(map[string]claim)
	for _, w := range m.winners {
		if w.kind != sourceDiscovered {
			named[w.path] = w
		}
	}
	for id, w := range m.winners {
		if o, ok := named[w.path]; ok && w.kind == sourceDiscovered && o.id != id {
			delete(m.winners, id)
			m.ignored = append(m.ignored, plugin.Ignored{Path: w.path, Reason: fmt.Sprintf(
				"the %s names this socket as plugin %q", o.kind, o.id)})
		}
	}
	for id, w := range m.winners {
		if w.absent != "" {
			m.absent[id] = w.absent
			continue
		}
		m.sockets[id] = w.inst
	}
	slices.SortFunc(m.ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) })
	return m
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
