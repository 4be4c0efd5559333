package dockerplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
)

// stateTaken is the state of a claim in use (VolumeClaim.state).
const stateTaken = "taken"

// The answers of the protocol, as Docker's plugin documentation names
// their fields.
type (
	activateResponse struct {
		Implements []string
	}
	mountResponse struct {
		Mountpoint string
	}
	getResponse struct {
		Volume volumeInfo
	}
	listResponse struct {
		Volumes []volumeInfo
	}
	capabilitiesResponse struct {
		Capabilities capabilities
	}
	capabilities struct {
		Scope string
	}
	// volumeInfo is a volume as Get and List answer it; List leaves out
	// CreatedAt and Status.
	volumeInfo struct {
		Name       string
		Mountpoint string
		CreatedAt  string        `json:",omitempty"`
		Status     *volumeStatus `json:",omitempty"`
	}
)

// volumeStatus is the Status of Get: the volume as the cluster knows it.
type volumeStatus struct {
	Plugin        string        `json:"plugin"`
	CapacityBytes int64         `json:"capacity_bytes"`
	Availability  string        `json:"availability,omitempty"`
	Claims        []claimStatus `json:"claims"`
	// Conditions are the abnormal health conditions reported of it.
	Conditions []string `json:"conditions,omitempty"`
}

// claimStatus is one claim of a volume in Get's Status.
type claimStatus struct {
	NodeID        string `json:"node_id"`
	WorkloadID    string `json:"workload_id"`
	State         string `json:"state"`
	Owner         string `json:"owner,omitempty"`
	HostPath      string `json:"host_path,omitempty"`
	ReleaseReason string `json:"release_reason,omitempty"`
}

func (s *Server) activate(context.Context, *request) (any, error) {
	return activateResponse{Implements: []string{"VolumeDriver"}}, nil
}

func (s *Server) capabilities(context.Context, *request) (any, error) {
	return capabilitiesResponse{Capabilities: capabilities{Scope: "global"}}, nil
}

// checkName checks the volume name of a call: a csisupd volume id.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("the volume's Name is required")
	case !ids.ValidPathID(name):
		return fmt.Errorf("volume name %q is not a csisupd volume id: 1 to 128 letters, digits, '.', '_' and '-', starting with a letter or digit", name)
	}
	return nil
}

// workload returns the workload of a Mount or Unmount call.
func workload(req *request) (string, error) {
	if err := checkName(req.Name); err != nil {
		return "", err
	}
	if req.ID == "" {
		return "", fmt.Errorf("volume %q: the mount's ID is required (Docker and Podman send one)", req.Name)
	}
	w := WorkloadPrefix + req.ID
	if !ids.ValidPathID(w) {
		return "", fmt.Errorf("volume %q: ID %q does not make a csisupd workload id (%s+ID: at most 128 letters, digits, '.', '_' and '-')", req.Name, req.ID, WorkloadPrefix)
	}
	return w, nil
}

// create creates the volume, or adopts the volume of that name.
func (s *Server) create(ctx context.Context, req *request) (any, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	o, err := s.parseOpts(req.Name, req.Opts)
	if err != nil {
		return nil, err
	}
	v, err := s.cfg.Cluster.GetVolume(ctx, req.Name)
	switch {
	case err == nil:
		return s.adopt(v, o)
	case !isNotFound(err):
		return nil, clusterError(fmt.Sprintf("create volume %q: look it up", req.Name), err)
	}
	creq, err := o.createRequest()
	if err != nil {
		return nil, err
	}
	_, err = s.cfg.Cluster.CreateVolume(ctx, creq)
	if status.Code(err) == codes.AlreadyExists {
		// Made by someone else since GetVolume: adopt it as well.
		if v, gerr := s.cfg.Cluster.GetVolume(ctx, req.Name); gerr == nil {
			return s.adopt(v, o)
		}
	}
	if err != nil {
		return nil, clusterError(fmt.Sprintf("create volume %q with plugin %q", req.Name, creq.GetPluginId()), err)
	}
	s.logger.Info("volume created", "volume", req.Name, "plugin", creq.GetPluginId())
	return struct{}{}, nil
}

// adopt answers a Create of volume v, which exists: success, unless the
// options name another plugin than v's.
func (s *Server) adopt(v *csisupdv1.Volume, o *createOpts) (any, error) {
	if o.plugin != "" && o.plugin != v.GetPluginId() {
		return nil, fmt.Errorf("volume %q exists with plugin %q, not %q: use another name, or drop -o plugin to use the existing volume",
			v.GetId(), v.GetPluginId(), o.plugin)
	}
	s.logger.Debug("volume exists; adopted", "volume", v.GetId(), "plugin", v.GetPluginId())
	return struct{}{}, nil
}

// remove deletes the volume; a missing one is success, one with claims
// is refused.
func (s *Server) remove(ctx context.Context, req *request) (any, error) {
	if err := checkName(req.Name); err != nil {
		return nil, err
	}
	v, err := s.cfg.Cluster.GetVolume(ctx, req.Name)
	switch {
	case isNotFound(err):
		return struct{}{}, nil
	case err != nil:
		return nil, clusterError(fmt.Sprintf("remove volume %q: look it up", req.Name), err)
	case len(v.GetClaims()) > 0:
		return nil, inUse(v)
	}
	err = s.cfg.Cluster.DeleteVolume(ctx, req.Name)
	switch {
	case err == nil:
		s.logger.Info("volume deleted", "volume", req.Name, "plugin", v.GetPluginId())
		return struct{}{}, nil
	case isNotFound(err):
		return struct{}{}, nil
	case status.Code(err) == codes.FailedPrecondition:
		// Claimed since GetVolume: name the claims if there are any.
		if v, gerr := s.cfg.Cluster.GetVolume(ctx, req.Name); gerr == nil && len(v.GetClaims()) > 0 {
			return nil, inUse(v)
		}
	}
	return nil, clusterError(fmt.Sprintf("remove volume %q", req.Name), err)
}

// inUse is the error of a Remove of volume v, which has claims.
func inUse(v *csisupdv1.Volume) error {
	claims := sortedClaims(v)
	parts := make([]string, len(claims))
	for i, c := range claims {
		parts[i] = fmt.Sprintf("workload %s on node %s (%s)", c.GetWorkloadId(), c.GetNodeId(), c.GetState())
	}
	return fmt.Errorf("volume %q is in use: %d claim(s): %s; stop the containers that use it first (docker ps --filter volume=%s; podman ps takes the same filter), then remove it again",
		v.GetId(), len(claims), strings.Join(parts, "; "), v.GetId())
}

// mount claims the volume on this node for the call's workload and
// answers the claim's host path.
func (s *Server) mount(ctx context.Context, req *request) (any, error) {
	w, err := workload(req)
	if err != nil {
		return nil, err
	}
	resp, err := s.cfg.Cluster.Claim(ctx, req.Name, w, Owner, s.cfg.Lease, nil)
	if err != nil {
		return nil, clusterError(fmt.Sprintf("mount volume %q (claim for workload %s on this node)", req.Name, w), err)
	}
	c := resp.GetClaim()
	if c.GetHostPath() == "" {
		return nil, fmt.Errorf("mount volume %q: its claim for workload %s is %s without a host path; unmount and retry, or see `csisupd volume status %s`",
			req.Name, w, c.GetState(), req.Name)
	}
	s.logger.Info("volume mounted", "volume", req.Name, "workload", w, "host_path", c.GetHostPath())
	return mountResponse{Mountpoint: c.GetHostPath()}, nil
}

// unmount releases the claim of the call's workload; a volume that is
// gone has nothing to release.
func (s *Server) unmount(ctx context.Context, req *request) (any, error) {
	w, err := workload(req)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Cluster.Release(ctx, req.Name, w); err != nil && !isNotFound(err) {
		return nil, clusterError(fmt.Sprintf("unmount volume %q (release the claim of workload %s)", req.Name, w), err)
	}
	s.logger.Info("volume unmounted", "volume", req.Name, "workload", w)
	return struct{}{}, nil
}

// lookup returns the volume a Path or Get names, with an error saying
// "no such volume" when it does not exist: Docker and Podman read an
// error of Get as that.
func (s *Server) lookup(ctx context.Context, name string) (*csisupdv1.Volume, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	v, err := s.cfg.Cluster.GetVolume(ctx, name)
	switch {
	case isNotFound(err):
		return nil, &callError{err: err, msg: fmt.Sprintf("volume %q: no such volume in the csisupd cluster; create it first (docker volume create --driver <this driver> -o plugin=<plugin id> %s)", name, name)}
	case err != nil:
		return nil, clusterError(fmt.Sprintf("volume %q", name), err)
	}
	return v, nil
}

func (s *Server) path(ctx context.Context, req *request) (any, error) {
	v, err := s.lookup(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return mountResponse{Mountpoint: s.localPath(v)}, nil
}

func (s *Server) get(ctx context.Context, req *request) (any, error) {
	v, err := s.lookup(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	info := volumeInfo{Name: v.GetId(), Mountpoint: s.localPath(v), Status: volumeStatusOf(v)}
	if v.GetCreatedAt() != nil {
		info.CreatedAt = v.GetCreatedAt().AsTime().UTC().Format(time.RFC3339)
	}
	return getResponse{Volume: info}, nil
}

func (s *Server) list(ctx context.Context, _ *request) (any, error) {
	vols, err := s.cfg.Cluster.ListVolumes(ctx)
	if err != nil {
		return nil, clusterError("list volumes", err)
	}
	out := make([]volumeInfo, 0, len(vols))
	for _, v := range vols {
		out = append(out, volumeInfo{Name: v.GetId(), Mountpoint: s.localPath(v)})
	}
	slices.SortFunc(out, func(a, b volumeInfo) int { return cmp.Compare(a.Name, b.Name) })
	return listResponse{Volumes: out}, nil
}

// localPath returns the host path of a claim of v taken on this node, the
// first by workload when there are several; "" when there is none.
func (s *Server) localPath(v *csisupdv1.Volume) string {
	node := s.cfg.Cluster.NodeID()
	for _, c := range sortedClaims(v) {
		if c.GetNodeId() == node && c.GetState() == stateTaken && c.GetHostPath() != "" {
			return c.GetHostPath()
		}
	}
	return ""
}

// sortedClaims returns v's claims sorted by workload, then node.
func sortedClaims(v *csisupdv1.Volume) []*csisupdv1.VolumeClaim {
	claims := slices.Clone(v.GetClaims())
	slices.SortFunc(claims, func(a, b *csisupdv1.VolumeClaim) int {
		return cmp.Or(cmp.Compare(a.GetWorkloadId(), b.GetWorkloadId()), cmp.Compare(a.GetNodeId(), b.GetNodeId()))
	})
	return claims
}

// volumeStatusOf returns the Status of v that Get answers.
func volumeStatusOf(v *csisupdv1.Volume) *volumeStatus {
	st := &volumeStatus{
		Plugin:        v.GetPluginId(),
		CapacityBytes: v.GetCapacityBytes(),
		Availability:  v.GetAvailability(),
		Claims:        []claimStatus{},
	}
	for _, c := range sortedClaims(v) {
		st.Claims = append(st.Claims, claimStatus{
			NodeID: c.GetNodeId(), WorkloadID: c.GetWorkloadId(), State: c.GetState(), Owner: c.GetOwner(),
			HostPath: c.GetHostPath(), ReleaseReason: c.GetReleaseReason(),
		})
	}
	for _, c := range v.GetConditions() {
		st.Conditions = append(st.Conditions, c.GetSource()+": "+c.GetMessage())
	}
	return st
}
