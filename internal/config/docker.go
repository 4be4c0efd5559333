package config

import (
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/csisupd/csisupd/internal/ids"
)

// The defaults of the docker { ... } block.
const (
	// DefaultDockerSocket is where Docker looks for a plugin named
	// csisupd (its plugin discovery reads /run/docker/plugins/*.sock).
	DefaultDockerSocket = "/run/docker/plugins/csisupd.sock"
	// DefaultDockerReconcileInterval spaces the reconciles against the
	// engine's running containers (docker.engine_socket).
	DefaultDockerReconcileInterval = time.Minute
	// DefaultDockerLease is the lease of the claims a Mount makes, which
	// the agent renews while the container runs: a claim outlives its node's
	// agent by at most this long.
	DefaultDockerLease = 30 * time.Second
)

// The bounds of docker.lease: those of a claim's lease_ttl.
const (
	minDockerLease = 5 * time.Second
	maxDockerLease = 24 * time.Hour
)

// DockerConfig is the docker { ... } block: the agent serves Docker's
// volume plugin API, which Docker and Podman call, so that every CSI
// driver the cluster knows is a volume driver of the engine on the node.
type DockerConfig struct {
	// Enabled turns the volume plugin on. Needs the client role and
	// servers to report to.
	Enabled bool
	// Socket is the unix socket the engine calls (DefaultDockerSocket).
	Socket string
	// DefaultPlugin is the plugin id of a volume created without the
	// plugin option; empty makes the option required.
	DefaultPlugin string
	// Group, when set, is the group (a name or a numeric id) that owns the
	// socket with root; the socket's mode is 0660.
	Group string
	// GroupID is Group resolved by validate; -1 when Group is empty.
	GroupID int
	// EngineSocket, when set, is the engine's Docker-compatible API socket
	// (docker.sock, or podman.sock of podman's API service): the agent
	// releases the claims of containers that no longer run.
	EngineSocket string
	// ReconcileInterval spaces those reconciles.
	ReconcileInterval time.Duration
	// Lease is the lease of the claims Mount makes.
	Lease time.Duration
}

// defaultDocker is the docker block of Default.
func defaultDocker() DockerConfig {
	return DockerConfig{
		Socket:            DefaultDockerSocket,
		GroupID:           -1,
		ReconcileInterval: DefaultDockerReconcileInterval,
		Lease:             DefaultDockerLease,
	}
}

// docker checks the docker block and resolves its group. It checks the
// keys even when the block is off, so that a mistake shows before it is
// turned on.
func (v *validator) docker() {
	d := &v.c.Docker
	d.GroupID = -1
	if d.Socket == "" || !filepath.IsAbs(d.Socket) {
		v.add("docker.socket", "%q must be an absolute path (Docker reads %s)", d.Socket, filepath.Dir(DefaultDockerSocket))
	}
	if d.EngineSocket != "" && !filepath.IsAbs(d.EngineSocket) {
		v.add("docker.engine_socket", "%q must be an absolute path, such as /run/docker.sock or /run/podman/podman.sock", d.EngineSocket)
	}
	if d.DefaultPlugin != "" {
		if !ids.ValidPluginID(d.DefaultPlugin) {
			v.add("docker.default_plugin", "%q is not a plugin id (letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit)", d.DefaultPlugin)
		}
	}
	if d.Lease < minDockerLease || d.Lease > maxDockerLease {
		v.add("docker.lease", "must be between %s and %s (the bounds of a claim's lease), got %s", minDockerLease, maxDockerLease, d.Lease)
	}
	v.positive("docker.reconcile_interval", d.ReconcileInterval)
	if d.Group != "" {
		d.GroupID = v.group("docker.group", d.Group)
	}
	if !d.Enabled {
		return
	}
	if !v.c.Client.Enabled {
		v.add("docker.enabled", "the Docker volume plugin needs the client role: set client.enabled = true")
	}
}

// group resolves a group name or numeric id, or records a problem with
// key and returns -1.
func (v *validator) group(key, group string) int {
	if n, err := strconv.Atoi(group); err == nil {
		if n < 0 {
			v.add(key, "%q: a group id must not be negative", group)
			return -1
		}
		return n
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		v.add(key, "%q: no such group on this host (%v)", group, err)
		return -1
	}
	n, err := strconv.Atoi(g.Gid)
	if err != nil {
		v.add(key, "%q: group id %q is not a number", group, g.Gid)
		return -1
	}
	return n
}
