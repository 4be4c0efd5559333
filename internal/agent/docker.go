package agent

import (
	"errors"
	"fmt"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/dockerplugin"
	"github.com/csisupd/csisupd/internal/nodeclient"
)

// This file holds the setup steps of the claims the agent makes for
// workloads on its own node: the local claims (the Agent API's
// ClaimVolume and ReleaseVolume, which the systemd template unit and the
// CLI's volume mount call) and the Docker and Podman volume plugin.

// setupLocalClaims creates the local claims when the node client and its
// held leases exist; nil otherwise (the Agent API then refuses
// ClaimVolume, saying why).
func (a *Agent) setupLocalClaims() (*nodeclient.LocalClaims, error) {
	if a.nodes == nil || a.leases == nil {
		return nil, nil
	}
	lc, err := nodeclient.NewLocalClaims(nodeclient.LocalClaimsConfig{Client: a.nodes, Leases: a.leases}, a.log.Named("local-claims"))
	if err != nil {
		return nil, fmt.Errorf("agent: local claims: %w", err)
	}
	return lc, nil
}

// setupDocker opens the Docker volume plugin's socket when docker.enabled
// is set. It needs the local claims, which need servers to report to: a
// docker block on an agent without them fails New, saying so. Its part
// serves the socket; the docker block changes only by a restart.
func (a *Agent) setupDocker(cfg *config.Config) (*dockerplugin.Server, part, error) {
	d := cfg.Docker
	if !d.Enabled {
		return nil, part{}, nil
	}
	if a.localClaims == nil {
		return nil, part{}, errors.New("agent: docker.enabled: the Docker volume plugin makes its claims through the servers, and this agent has none to report to: " +
			"set client.servers, server.enabled, or consul.client_auto_join")
	}
	var group string
	if d.GroupID >= 0 {
		group = fmt.Sprint(d.GroupID)
	}
	srv, err := dockerplugin.New(dockerplugin.Config{
		Socket:            d.Socket,
		Group:             group,
		DefaultPlugin:     d.DefaultPlugin,
		Lease:             d.Lease,
		EngineSocket:      d.EngineSocket,
		ReconcileInterval: d.ReconcileInterval,
		Cluster:           a.localClaims,
		Watchdog:          a.watchdog,
	}, a.log.Named("docker"))
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: docker: %w", err)
	}
	return srv, part{name: "docker volume plugin", run: srv.Run, close: srv.Close}, nil
}
