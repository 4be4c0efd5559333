package netlab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Config describes a lab.
type Config struct {
	// Hosts names the hosts, in the order of their addresses: the k-th
	// (from 1) has 198.18.k.2. Names are 1 to 15 lower-case letters and
	// digits, unique, and not "router"; at most MaxHosts.
	Hosts []string
	// Prefix starts the names of the lab's namespaces; lower-case letters
	// and digits. Default "netlab".
	Prefix string
	// CommandTimeout bounds each command the lab runs to build, change
	// and remove itself. Default 10s.
	CommandTimeout time.Duration
}

// MaxHosts is the largest number of hosts in a lab: one 198.18.k.0/30 each.
const MaxHosts = 254

// DefaultPrefix is the prefix of namespace names when Config.Prefix is
// empty.
const DefaultPrefix = "netlab"

const (
	defaultTimeout = 10 * time.Second
	routerName     = "router"
	// chain is the lab's own chain in the router's filter table.
	chain = "NETLAB"
	// hostIf is the host's end of its link to the router.
	hostIf = "eth0"
)

var (
	hostRE   = regexp.MustCompile(`^[a-z0-9]{1,15}$`)
	prefixRE = regexp.MustCompile(`^[a-z0-9]{1,32}$`)
)

// Lab is a running lab network. Its methods are safe for concurrent use.
type Lab struct {
	id      string // <prefix>-<pid>-<n>
	prefix  string
	hosts   []string
	index   map[string]int // host -> k, from 1
	timeout time.Duration

	mu     sync.Mutex
	cuts   map[link]bool
	closed bool
}

// link is one direction between two hosts.
type link struct{ from, to string }

var (
	// labSeq numbers the labs of this process.
	labSeq atomic.Int64
	// live holds the ids of this process's labs that are not closed, so
	// that stale cleanup leaves them alone.
	liveMu sync.Mutex
	live   = map[string]bool{}
)

// New builds a lab with cfg's hosts and removes it when t's test ends. It
// first removes the namespaces left by labs of the same prefix whose
// process is gone. On error nothing of the new lab is left behind.
func New(t testing.TB, cfg Config) (*Lab, error) {
	t.Helper()
	l, err := build(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab: removing the lab: %v", err)
		}
	})
	return l, nil
}

func build(cfg Config) (*Lab, error) {
	l, err := newLab(cfg)
	if err != nil {
		return nil, err
	}
	if err := removeStale(l.prefix, l.timeout); err != nil {
		return nil, err
	}
	liveMu.Lock()
	live[l.id] = true
	liveMu.Unlock()
	if err := l.setUp(); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

// newLab checks cfg and returns the lab it describes, not yet built.
func newLab(cfg Config) (*Lab, error) {
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	l := &Lab{
		id:      fmt.Sprintf("%s-%d-%d", cfg.Prefix, os.Getpid(), labSeq.Add(1)),
		prefix:  cfg.Prefix,
		hosts:   append([]string(nil), cfg.Hosts...),
		index:   map[string]int{},
		timeout: cfg.CommandTimeout,
		cuts:    map[link]bool{},
	}
	for i, h := range l.hosts {
		l.index[h] = i + 1
	}
	return l, nil
}

func validate(cfg *Config) error {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = defaultTimeout
	}
	if !prefixRE.MatchString(cfg.Prefix) {
		return fmt.Errorf("netlab: prefix %q: want 1 to 32 lower-case letters and digits", cfg.Prefix)
	}
	if len(cfg.Hosts) == 0 || len(cfg.Hosts) > MaxHosts {
		return fmt.Errorf("netlab: %d hosts: want 1 to %d", len(cfg.Hosts), MaxHosts)
	}
	seen := map[string]bool{}
	for _, h := range cfg.Hosts {
		switch {
		case !hostRE.MatchString(h):
			return fmt.Errorf("netlab: host name %q: want 1 to 15 lower-case letters and digits", h)
		case h == routerName:
			return fmt.Errorf("netlab: host name %q is the router's", h)
		case seen[h]:
			return fmt.Errorf("netlab: host %q named twice", h)
		}
		seen[h] = true
	}
	return nil
}

// setUp creates the namespaces, links, addresses, routes and the lab's
// iptables chain.
func (l *Lab) setUp() error {
	r := l.RouterNamespace()
	if err := l.ip("netns", "add", r); err != nil {
		return err
	}
	for _, h := range l.hosts {
		if err := l.ip("netns", "add", l.Namespace(h)); err != nil {
			return err
		}
	}
	for _, ns := range l.namespaces() {
		if err := l.ip("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	for _, h := range l.hosts {
		ns, rif, k := l.Namespace(h), l.routerIf(h), l.index[h]
		steps := [][]string{
			// Created in the router's namespace with the peer placed
			// straight into the host's: no end ever exists in ours.
			{"-n", r, "link", "add", rif, "type", "veth", "peer", "name", hostIf, "netns", ns},
			{"-n", r, "addr", "add", fmt.Sprintf("198.18.%d.1/30", k), "dev", rif},
			{"-n", r, "link", "set", rif, "up"},
			{"-n", ns, "addr", "add", fmt.Sprintf("198.18.%d.2/30", k), "dev", hostIf},
			{"-n", ns, "link", "set", hostIf, "up"},
			{"-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", k)},
		}
		for _, s := range steps {
			if err := l.ip(s...); err != nil {
				return err
			}
		}
	}
	// /proc/sys/net belongs to the namespace of the process that opens
	// it, hence a shell in the router's namespace.
	if _, err := run(l.timeout, nil, "ip", "netns", "exec", r, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"); err != nil {
		return err
	}
	return l.restore("*filter\n:FORWARD ACCEPT [0:0]\n:" + chain + " - [0:0]\n-A FORWARD -j " + chain + "\nCOMMIT\n")
}

// Hosts returns the lab's host names in address order.
func (l *Lab) Hosts() []string { return append([]string(nil), l.hosts...) }

// Addr returns host's IPv4 address, such as "198.18.1.2". It panics if the
// lab has no such host: a misspelt host name is a bug in the test.
func (l *Lab) Addr(host string) string {
	return fmt.Sprintf("198.18.%d.2", l.mustIndex(host))
}

// Namespace returns the name of host's network namespace, for commands
// such as `ip netns exec NAME ...` and `ip -n NAME ...`. It panics if the
// lab has no such host.
func (l *Lab) Namespace(host string) string {
	l.mustIndex(host)
	return l.id + "-" + host
}

// RouterNamespace returns the name of the router's network namespace.
func (l *Lab) RouterNamespace() string { return l.id + "-" + routerName }

func (l *Lab) mustIndex(host string) int {
	k, ok := l.index[host]
	if !ok {
		panic(fmt.Sprintf("netlab: no host %q in the lab (hosts %v)", host, l.hosts))
	}
	return k
}

// routerIf is the router's end of host's link.
func (l *Lab) routerIf(host string) string { return "h" + strconv.Itoa(l.index[host]) }

// namespaces returns the router's namespace and the hosts'.
func (l *Lab) namespaces() []string {
	out := []string{l.RouterNamespace()}
	for _, h := range l.hosts {
		out = append(out, l.id+"-"+h)
	}
	return out
}

// Command returns a command that runs name with args in host's network
// namespace, through `ip netns exec`; the Cmd's process is the program
// itself. An unknown host gives a Cmd whose Start fails.
func (l *Lab) Command(host, name string, args ...string) *exec.Cmd {
	return l.CommandContext(context.Background(), host, name, args...)
}

// CommandContext is Command with a context that kills the program, as
// exec.CommandContext.
func (l *Lab) CommandContext(ctx context.Context, host, name string, args ...string) *exec.Cmd {
	if _, ok := l.index[host]; !ok {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Err = fmt.Errorf("netlab: no host %q in the lab (hosts %v)", host, l.hosts)
		return cmd
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.Namespace(host), name}, args...)...)
}

// Close kills the processes still running in the lab's namespaces and
// deletes the namespaces, which removes their links and iptables rules.
// It is called at the end of the test that made the lab; calling it again
// does nothing.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	err := removeNamespaces(l.namespaces(), l.timeout)
	liveMu.Lock()
	delete(live, l.id)
	liveMu.Unlock()
	return err
}

func (l *Lab) ip(args ...string) error {
	_, err := run(l.timeout, nil, "ip", args...)
	return err
}
