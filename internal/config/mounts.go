package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/csisupd/csisupd/internal/ids"
)

// PropagationRShared is the mount propagation of a bidirectional mount:
// mounts made below it on either side appear on the other.
const PropagationRShared = "rshared"

// MountKind says what a PluginMount is for, so that each way of running a
// plugin can render it as that way needs.
type MountKind string

// The mounts a plugin needs.
const (
	// MountSocketDir is the directory of the plugin's socket.
	MountSocketDir MountKind = "socket_dir"
	// MountRoot is the plugin's mount root (Config.MountDir).
	MountRoot MountKind = "mount_root"
	// MountDev is the host's /dev, for block volumes.
	MountDev MountKind = "dev"
)

// PluginMount is one path a plugin's container or unit must have.
type PluginMount struct {
	// Kind says what the mount is for; it is not part of the JSON output.
	Kind MountKind `json:"-"`
	// Source is the path on the host.
	Source string `json:"source"`
	// Target is the path the plugin sees Source at.
	Target string `json:"target"`
	// Propagation is PropagationRShared, or empty for the runtime's
	// default (a private bind mount), which is all a socket needs.
	Propagation string `json:"propagation"`
	// ReadOnly is true for a mount the plugin only reads.
	ReadOnly bool `json:"read_only"`
	// Reason says why the plugin needs the mount, in one sentence.
	Reason string `json:"reason"`
}

// VolumeSpec is m in the SRC:DST[:OPTIONS] form of podman's --volume and
// of a quadlet's Volume=. The form has no escape for a colon: the caller
// refuses paths with one.
func (m PluginMount) VolumeSpec() string {
	var opts []string
	if m.ReadOnly {
		opts = append(opts, "ro")
	}
	if m.Propagation != "" {
		opts = append(opts, m.Propagation)
	}
	v := m.Source + ":" + m.Target
	if len(opts) > 0 {
		v += ":" + strings.Join(opts, ",")
	}
	return v
}

// PluginMounts is what a plugin, run in a container or as a service beside
// the agent, must see of the host: what PluginMounts computes.
type PluginMounts struct {
	// PluginID is the plugin's id.
	PluginID string `json:"plugin_id"`
	// Type is the plugin's declared type, empty when none is declared.
	Type string `json:"-"`
	// Socket is the socket path the agent dials: the declared socket, or
	// csi.sock in the plugin's subdirectory of client.plugin_dir.
	Socket string `json:"-"`
	// Mounts are the mounts, the socket directory first.
	Mounts []PluginMount `json:"mounts"`
	// Notes are what else the operator must know; never nil.
	Notes []string `json:"notes"`
}

// MountsVolumes reports whether the plugin may stage and publish volumes:
// every type but controller, which never does.
func (m PluginMounts) MountsVolumes() bool { return m.Type != "controller" }

// Mapped reports whether the plugin sees its mount root at another path
// than the host (plugin_mount_dir).
func (m PluginMounts) Mapped() bool {
	for _, mt := range m.Mounts {
		if mt.Kind == MountRoot {
			return mt.Source != mt.Target
		}
	}
	return false
}

// PluginMounts computes the mounts plugin id needs to run beside this
// agent in a container (or as a service): the directory of the socket the
// agent dials, the mount root with bidirectional propagation at the path
// the plugin sees it (plugin_mount_dir), and /dev unless the plugin is
// declared a controller. An id without a plugin block gets the defaults,
// with a note saying so.
func (c *Config) PluginMounts(id string) (PluginMounts, error) {
	if !ids.ValidPluginID(id) {
		return PluginMounts{}, fmt.Errorf("plugin id %q: must match %s", id, ids.PluginIDPattern)
	}
	p, declared := c.Plugins[id]
	if c.DataDir == "" && p.MountDir == "" {
		return PluginMounts{}, errors.New("data_dir is empty (dev mode makes a temporary one): set data_dir, or the plugin's mount_dir")
	}
	if c.Client.PluginDir == "" && p.Socket == "" {
		return PluginMounts{}, errors.New("client.plugin_dir is empty (dev mode makes a temporary one): set client.plugin_dir, or the plugin's socket")
	}
	pm := PluginMounts{PluginID: id, Type: p.Type, Notes: []string{}}
	block := fmt.Sprintf("plugin %q", id)
	if !declared {
		pm.Notes = append(pm.Notes, fmt.Sprintf("no %s block declares this plugin: the defaults apply "+
			"(socket found in client.plugin_dir, mount root <data_dir>/volumes/%s)", block, id))
	}
	if !c.Client.Enabled {
		pm.Notes = append(pm.Notes, "client.enabled is false: this agent supervises no plugin")
	}

	var sockDir, sockReason string
	if p.Socket != "" {
		pm.Socket = p.Socket
		sockDir = filepath.Dir(p.Socket)
		sockReason = fmt.Sprintf("socket directory (%s { socket }): the plugin must create its socket as %s; "+
			"csisupd dials it there", block, p.Socket)
	} else {
		sockDir = filepath.Join(c.Client.PluginDir, id)
		pm.Socket = filepath.Join(sockDir, "csi.sock")
		sockReason = fmt.Sprintf("socket directory (<client.plugin_dir>/%s): the plugin must create its socket as %s; "+
			"csisupd finds and dials it there", id, pm.Socket)
		if c.Client.KubeletRegistrationDir != "" {
			pm.Notes = append(pm.Notes, fmt.Sprintf("client.kubelet_registration_dir is set: a driver registered through it "+
				"names its own endpoint, which csisupd dials instead; declare %s { socket } to pin it", block))
		}
	}
	// The socket needs no propagation: the plugin creates it in a
	// directory both sides see.
	pm.Mounts = append(pm.Mounts, PluginMount{Kind: MountSocketDir, Source: sockDir, Target: sockDir, Reason: sockReason})

	root := c.MountDir(id)
	const rootWhy = "mount root, bidirectional: the plugin stages and publishes volumes below it, and its mounts must " +
		"appear on the host, where csisupd and the workloads see them; "
	target, rootReason := root, rootWhy+"mounted at the same path (no plugin_mount_dir)"
	if p.PluginMountDir != "" {
		target = p.PluginMountDir
		rootReason = fmt.Sprintf(rootWhy+"mounted at %s (%s { plugin_mount_dir }), csisupd translates the paths it sends",
			target, block)
	}
	pm.Mounts = append(pm.Mounts, PluginMount{Kind: MountRoot, Source: root, Target: target,
		Propagation: PropagationRShared, Reason: rootReason})
	if within(sockDir, root) || within(root, sockDir) {
		pm.Notes = append(pm.Notes, fmt.Sprintf("the socket directory %s and the mount root %s nest: "+
			"keep the socket out of the mount root", sockDir, root))
	}

	if pm.MountsVolumes() {
		pm.Mounts = append(pm.Mounts, PluginMount{Kind: MountDev, Source: "/dev", Target: "/dev",
			Propagation: PropagationRShared, Reason: "/dev, bidirectional: a plugin serving block volumes attaches " +
				"devices and publishes device nodes; only a plugin declared type = \"controller\" goes without"})
	} else {
		pm.Notes = append(pm.Notes, fmt.Sprintf("%s { type = \"controller\" }: a controller never stages or publishes, "+
			"so it needs no /dev", block))
	}
	return pm, nil
}
