package netlab

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Cut drops every packet host from sends to host to, from now on and on
// connections already open; packets from to to from still pass. See the
// package documentation for what this means for TCP. Cutting a link that
// is cut does nothing.
func (l *Lab) Cut(from, to string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.check(from, to); err != nil {
			return err
		}
		c[link{from, to}] = true
		return nil
	})
}

// CutBoth cuts the links between a and b in both directions.
func (l *Lab) CutBoth(a, b string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.check(a, b); err != nil {
			return err
		}
		c[link{a, b}], c[link{b, a}] = true, true
		return nil
	})
}

// Isolate cuts host from every other host and every other host from it,
// at once.
func (l *Lab) Isolate(host string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.checkHost(host); err != nil {
			return err
		}
		for _, o := range l.hosts {
			if o != host {
				c[link{host, o}], c[link{o, host}] = true, true
			}
		}
		return nil
	})
}

// Heal undoes Cut(from, to). Healing a link that is not cut does nothing.
func (l *Lab) Heal(from, to string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.check(from, to); err != nil {
			return err
		}
		delete(c, link{from, to})
		return nil
	})
}

// HealBoth heals the links between a and b in both directions.
func (l *Lab) HealBoth(a, b string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.check(a, b); err != nil {
			return err
		}
		delete(c, link{a, b})
		delete(c, link{b, a})
		return nil
	})
}

// Rejoin heals every cut from or to host, such as those of Isolate(host).
func (l *Lab) Rejoin(host string) error {
	return l.change(func(c map[link]bool) error {
		if err := l.checkHost(host); err != nil {
			return err
		}
		for k := range c {
			if k.from == host || k.to == host {
				delete(c, k)
			}
		}
		return nil
	})
}

// HealAll heals every cut.
func (l *Lab) HealAll() error {
	return l.change(func(c map[link]bool) error {
		clear(c)
		return nil
	})
}

// Cuts returns the cut links as "from->to", sorted.
func (l *Lab) Cuts() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k := range l.cuts {
		out = append(out, k.from+"->"+k.to)
	}
	slices.Sort(out)
	return out
}

// change applies edit to a copy of the lab's cuts and, if that succeeds,
// rewrites the lab's chain to hold exactly the new cuts in one
// transaction. The cuts are unchanged if either step fails.
func (l *Lab) change(edit func(map[link]bool) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("netlab: lab %s is closed", l.id)
	}
	next := maps.Clone(l.cuts)
	if err := edit(next); err != nil {
		return err
	}
	if maps.Equal(next, l.cuts) {
		return nil
	}
	if err := l.restore(l.rules(next)); err != nil {
		return err
	}
	l.cuts = next
	return nil
}

// rules is the iptables-restore input that makes the lab's chain drop
// exactly cuts. Declaring the chain flushes it; the explicit flush says so.
func (l *Lab) rules(cuts map[link]bool) string {
	var b strings.Builder
	b.WriteString("*filter\n:" + chain + " - [0:0]\n-F " + chain + "\n")
	var lines []string
	for k := range cuts {
		lines = append(lines, fmt.Sprintf("-A %s -i %s -o %s -j DROP\n", chain, l.routerIf(k.from), l.routerIf(k.to)))
	}
	slices.Sort(lines)
	for _, s := range lines {
		b.WriteString(s)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

func (l *Lab) check(from, to string) error {
	if err := l.checkHost(from); err != nil {
		return err
	}
	if err := l.checkHost(to); err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("netlab: a host's link to itself cannot be cut (%q)", from)
	}
	return nil
}

func (l *Lab) checkHost(h string) error {
	if _, ok := l.index[h]; !ok {
		return fmt.Errorf("netlab: no host %q in the lab (hosts %v)", h, l.hosts)
	}
	return nil
}
