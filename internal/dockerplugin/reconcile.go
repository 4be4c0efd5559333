package dockerplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
)

// Bounds of the reconcile: engineTimeout bounds the engine's container
// list, maxEngineResponse its size (a summary is a few KiB: thousands of
// containers fit), passTimeout a whole pass.
const (
	engineTimeout     = 30 * time.Second
	maxEngineResponse = 32 << 20
	maxEngineError    = 4 << 10
	passTimeout       = 2 * time.Minute
)

// deadStates are the container states whose volumes the engine has
// unmounted, or is about to: Docker's exited and dead, Podman's stopped.
// Every other state is live: a container being created or started has had
// Mount called before it runs.
var deadStates = []string{"exited", "dead", "stopped"}

// engineClient reads an engine's Docker-compatible API on a unix socket.
type engineClient struct {
	socket string
	client *http.Client
}

// newEngineClient returns the client of the engine API at socket. Each
// call opens a connection of its own: one call per reconcile interval
// keeps nothing open between them.
func newEngineClient(socket string) *engineClient {
	var d net.Dialer
	return &engineClient{socket: socket, client: &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: engineTimeout,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// engineContainer is what the reconcile reads of a container of GET
// /containers/json: its id, state, and the volumes it mounts.
type engineContainer struct {
	ID     string `json:"Id"`
	State  string `json:"State"`
	Mounts []struct {
		Type string `json:"Type"`
		Name string `json:"Name"`
	} `json:"Mounts"`
}

// containers lists the engine's containers, all states (all=true), within
// engineTimeout and maxEngineResponse.
func (e *engineClient) containers(ctx context.Context) ([]engineContainer, error) {
	ctx, cancel := context.WithTimeout(ctx, engineTimeout)
	defer cancel()
	const path = "/containers/json?all=true"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://engine"+path, nil)
	if err != nil {
		return nil, fmt.Errorf("engine socket %s: GET %s: %w", e.socket, path, err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("engine socket %s: GET %s: %w", e.socket, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxEngineError))
		return nil, fmt.Errorf("engine socket %s: GET %s: %s: %s", e.socket, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEngineResponse+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("engine socket %s: GET %s: read the answer: %w", e.socket, path, err)
	case len(body) > maxEngineResponse:
		return nil, fmt.Errorf("engine socket %s: GET %s: the answer is larger than %d bytes", e.socket, path, maxEngineResponse)
	}
	var cs []engineContainer
	if err := json.Unmarshal(body, &cs); err != nil {
		return nil, fmt.Errorf("engine socket %s: GET %s: the answer is not a JSON array of containers: %w", e.socket, path, err)
	}
	return cs, nil
}

// reconcileLoop runs a reconcile pass at once and then every
// ReconcileInterval until ctx ends. A failed pass is logged and tried
// again at the next interval.
func (s *Server) reconcileLoop(ctx context.Context) {
	loop := s.cfg.Watchdog.Loop("docker reconcile")
	defer loop.Done()
	for {
		loop.Busy(time.Now().Add(passTimeout))
		pctx, cancel := context.WithTimeout(ctx, passTimeout)
		resp, err := s.reconcile(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.logger.Warn("reconcile with the engine's containers failed; nothing released, retrying at the next interval",
				"engine_socket", s.cfg.EngineSocket, "in", s.cfg.ReconcileInterval, "error", err)
		case len(resp.GetReleased()) > 0:
			s.logger.Info("released the claims of containers the engine no longer runs",
				"engine_socket", s.cfg.EngineSocket, "released", claimRefs(resp.GetReleased()))
		default:
			s.logger.Debug("reconciled with the engine's containers", "engine_socket", s.cfg.EngineSocket, "kept_by_index", len(resp.GetKeptByIndex()))
		}
		if loop.Wait(ctx, s.cfg.ReconcileInterval) != nil {
			return
		}
	}
}

// reconcile runs one pass: the claims index first, then the engine's
// containers and the cluster's volumes, then Sync of the live workloads
// with that index. A failure before Sync releases nothing.
func (s *Server) reconcile(ctx context.Context) (*csisupdv1.SyncNodeClaimsResponse, error) {
	idx, err := s.cfg.Cluster.ClaimsIndex(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the cluster's claims index: %w", err)
	}
	cs, err := s.engine.containers(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := s.cfg.Cluster.ListVolumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the cluster's volumes: %w", err)
	}
	live := liveWorkloads(cs, vols, s.cfg.Cluster.NodeID())
	resp, err := s.cfg.Cluster.Sync(ctx, Owner, live, idx)
	if err != nil {
		return nil, fmt.Errorf("sync the claims of owner %s with %d live workloads at index %d: %w", Owner, len(live), idx, err)
	}
	return resp, nil
}

// liveWorkloads returns the workloads of owner Owner live on node,
// sorted. The workload of a listed container (an engine that mounts with
// container ids) is live while the container is. Docker's and Podman's
// Mount ids are their own, matching no container: a claim of node and
// Owner whose id is no listed container's is live while a live container
// mounts its volume by name.
func liveWorkloads(cs []engineContainer, vols []*csisupdv1.Volume, node string) []string {
	live := map[string]bool{}
	listed := map[string]bool{}
	mounted := map[string]bool{}
	for _, c := range cs {
		w := WorkloadPrefix + c.ID
		listed[w] = true
		if slices.Contains(deadStates, strings.ToLower(c.State)) {
			continue
		}
		if c.ID != "" && ids.ValidPathID(w) {
			live[w] = true
		}
		for _, m := range c.Mounts {
			if m.Type == "volume" && m.Name != "" {
				mounted[m.Name] = true
			}
		}
	}
	for _, v := range vols {
		if !mounted[v.GetId()] {
			continue
		}
		for _, c := range v.GetClaims() {
			if c.GetNodeId() == node && c.GetOwner() == Owner && !listed[c.GetWorkloadId()] {
				live[c.GetWorkloadId()] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(live))
}

// claimRefs formats claims for a log line.
func claimRefs(refs []*csisupdv1.ClaimRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.GetVolumeId() + "/" + r.GetWorkloadId()
	}
	return out
}
