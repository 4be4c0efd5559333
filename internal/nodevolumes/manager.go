package nodevolumes

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// NodeVolumes method names, as CapabilityMissing errors name them.
const (
	methodMount   = "MountVolume"
	methodUnmount = "UnmountVolume"
	methodExpand  = "ExpandVolume"
	methodStats   = "VolumeStats"
	// methodVolumeHealth and methodStorageHealth are the NodeVolumes
	// health methods.
	methodVolumeHealth  = "VolumeHealth"
	methodStorageHealth = "StorageHealth"
)

// Manager stages, publishes, unpublishes and unstages volumes through the
// node service of this node's plugins, and keeps a record of every mount
// on disk. Create it with New and start its background work with Run. All
// methods are safe for concurrent use.
type Manager struct {
	dataDir  string
	node     string // Config.NodeName, for CapabilityMissing errors
	store    *store
	calls    *csiclient.Invoker
	dirs     map[string]PluginDirs
	timeout  time.Duration
	retry    retry.Policy
	events   EventSink
	log      hclog.Logger
	claims   ClaimSource
	interval time.Duration
	quiet    time.Duration     // Config.QuietStart
	watchdog *watchdog.Monitor // Config.Watchdog
	health   HealthReporter    // Config.HealthReport
	healthIn time.Duration     // Config.HealthInterval

	locks keylock.Set // one per (plugin, volume)
	dirMu sync.Mutex  // serialises creating and removing mount directories

	mu      sync.Mutex
	records map[string]*record // by file name; each changed only under its volume's lock
	// pending are the records whose step must be finished or undone in
	// the background; initial those among them that New found, which
	// Recovered waits for.
	pending map[string]bool
	initial map[string]bool
	// removals counts the records removed, and removedAt holds the count
	// at each one's removal, so that a reconcile tells a mount undone
	// after it read the claims from a lost one.
	removals  uint64
	removedAt map[string]uint64
	runCtx    context.Context // set while Run runs
	wg        sync.WaitGroup  // Run's goroutines
	ran       bool
	recovered chan struct{}
	trigger   chan struct{}
}

// New validates cfg and loads every mount record of cfg.DataDir. A record
// that cannot be read is an error naming its file; no record is removed.
// Records of steps that were in progress are finished or undone by Run.
func New(cfg Config) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	dataDir := filepath.Clean(cfg.DataDir)
	dirs := make(map[string]PluginDirs, len(cfg.PluginDirs))
	for id, d := range cfg.PluginDirs {
		if d.MountDir != "" {
			d.MountDir = filepath.Clean(d.MountDir)
		}
		if d.PluginMountDir != "" {
			d.PluginMountDir = filepath.Clean(d.PluginMountDir)
		}
		dirs[id] = d
	}
	if err := os.MkdirAll(filepath.Join(dataDir, "volumes"), dirMode); err != nil {
		return nil, fmt.Errorf("volumes: create %q: %w", filepath.Join(dataDir, "volumes"), err)
	}
	calls, err := csiclient.NewInvoker(csiclient.InvokerConfig{Plugins: cfg.Plugins, NodeName: cfg.NodeName, Retry: cfg.Retry, Logger: cfg.Logger.Named("volumes"),
		Secrets: cfg.Secrets})
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	st, recs, err := openStore(filepath.Join(dataDir, RecordsDir))
	if err != nil {
		return nil, err
	}
	m := &Manager{
		dataDir:   dataDir,
		node:      cfg.NodeName,
		store:     st,
		calls:     calls,
		dirs:      dirs,
		timeout:   cfg.RPCTimeout,
		retry:     cfg.Retry,
		events:    cfg.Events,
		log:       cfg.Logger.Named("volumes"),
		claims:    cfg.Claims,
		interval:  cfg.ReconcileInterval,
		quiet:     cfg.QuietStart,
		watchdog:  cfg.Watchdog,
		health:    cfg.HealthReport,
		healthIn:  cfg.HealthInterval,
		records:   recs,
		pending:   make(map[string]bool),
		initial:   make(map[string]bool),
		removedAt: make(map[string]uint64),
		recovered: make(chan struct{}),
		trigger:   make(chan struct{}, 1),
	}
	lost := 0
	for name, r := range recs {
		switch r.State {
		case StatePublished:
		case StateRecordLost:
			// The servers still hold its claim: it waits for their
			// release, not for Run.
			lost++
		default:
			m.pending[name] = true
			m.log.Info("mount step unfinished at start; Run will finish or undo it",
				"plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID, "usage", r.UsageKey, "state", r.State)
		}
	}
	m.log.Debug("loaded mount records", "records", len(recs), "unfinished", len(m.pending), "record_lost", lost)
	return m, nil
}

// Mount stages the volume when the plugin stages and no other mount of
// the same usage has staged it, publishes it for the workload, and returns
// the mount. A published mount is returned as it is.
func (m *Manager) Mount(ctx context.Context, req *csisupdv1.MountVolumeRequest) (*csisupdv1.Mount, error) {
	if err := checkIDs(req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId()); err != nil {
		return nil, err
	}
	u, err := normaliseUsage(req.GetUsage())
	if err != nil {
		return nil, err
	}
	pluginID, volumeID, workloadID, usageKey := req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId(), u.key()
	externalID := cmp.Or(req.GetExternalId(), volumeID)

	unlock, err := m.lockVolume(ctx, pluginID, volumeID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Once it holds the volume, a mount runs its steps to their end, each
	// call within the RPC timeout, even when its caller goes away (a
	// leader that died mid-claim): a step cut off by its caller has an
	// unknown outcome, and its undo would then have to settle for the
	// RPC timeout, holding the claim's release as long. A release waits
	// for the volume's lock, so it comes after the mount either way.
	ctx = context.WithoutCancel(ctx)

	name := recordName(pluginID, volumeID, workloadID, usageKey)
	m.mu.Lock()
	existing := m.records[name]
	var other *record
	for _, r := range m.records {
		if r.PluginID == pluginID && r.VolumeID == volumeID && r.ExternalID != externalID {
			other = r
			break
		}
	}
	m.mu.Unlock()
	if other != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q of plugin %q is mounted with external id %q, not %q",
			volumeID, pluginID, other.ExternalID, externalID)
	}
	var lost *record // the record-lost record as it was, when existing is one
	if existing != nil {
		switch existing.State {
		case StatePublished:
			return existing.proto(), nil
		case StateRecordLost:
			// The servers finish the claim of a mount whose record was
			// lost: stage and publish it again (both are idempotent).
			lost = existing.clone()
		case StateSettling:
			// A failed mount undone and settling is mounted again: a late
			// effect of the failed step is what is asked now. The new
			// record replaces it, and its settling ends.
		default:
			return nil, csisupdv1.MarkRetryable(status.Errorf(codes.Aborted,
				"the mount of volume %q for workload %q (usage %s) is %s: its step is being finished or undone",
				volumeID, workloadID, usageKey, existing.State), "the step in progress ends by itself")
		}
	}

	p, err := m.resolve(pluginID, methodMount, "")
	if err != nil {
		return nil, err
	}
	// The servers admit a mount group only where the plugin has
	// VOLUME_MOUNT_GROUP; check again here, since a plugin may have been
	// replaced since, and scheduler agents call this node directly. A
	// plugin without the capability would ignore the group.
	if u.MountGroup != "" && !slices.Contains(p.GetNodeCapabilities(), plugin.CapVolumeMountGroup) {
		return nil, csisupdv1.NewNodeCapabilityMissingError(pluginID, m.node, methodMount, plugin.CapVolumeMountGroup)
	}
	var r *record
	if lost != nil {
		r, err = m.remountLost(lost.clone(), p, req)
	} else {
		r, err = m.newMount(req, u, externalID, p)
	}
	if err != nil {
		return nil, err
	}
	log := m.log.With("plugin", pluginID, "volume", volumeID, "workload", workloadID, "usage", usageKey)
	if err := m.save(r); err != nil {
		if lost != nil {
			m.restore(lost)
		} else {
			m.forget(r)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := m.makeDirs(r); err != nil {
		return nil, m.failMount(ctx, log, r, status.Error(codes.Internal, err.Error()), true)
	}

	if r.State == StateStaging {
		sreq := &csi.NodeStageVolumeRequest{
			VolumeId:          externalID,
			PublishContext:    req.GetPublishContext(),
			StagingTargetPath: r.PluginStagingPath,
			VolumeCapability:  u.capability(),
			Secrets:           req.GetSecrets(),
			VolumeContext:     req.GetVolumeContext(),
		}
		if _, err := call(ctx, m, pluginID, methodMount, "NodeStageVolume", sreq, csi.NodeClient.NodeStageVolume); err != nil {
			return nil, m.failMount(ctx, log, r, err, rejected(err))
		}
		m.emit(plugin.EventVolumeStaged, r, fmt.Sprintf("volume %s staged at %s (usage %s)", volumeID, r.StagingPath, usageKey))
		// Only in memory: on disk the record stays staging, which a
		// restart undoes by unpublishing (idempotent) and unstaging,
		// as it would a publishing one; the publish is recorded once
		// it is done.
		r.State = StatePublishing
		m.note(r)
	}

	preq := &csi.NodePublishVolumeRequest{
		VolumeId:          externalID,
		PublishContext:    req.GetPublishContext(),
		StagingTargetPath: r.PluginStagingPath,
		TargetPath:        r.PluginPath,
		VolumeCapability:  u.capability(),
		Readonly:          u.ReadOnly,
		Secrets:           req.GetSecrets(),
		VolumeContext:     req.GetVolumeContext(),
	}
	if _, err := call(ctx, m, pluginID, methodMount, "NodePublishVolume", preq, csi.NodeClient.NodePublishVolume); err != nil {
		return nil, m.failMount(ctx, log, r, err, rejected(err))
	}
	r.State, r.Error = StatePublished, ""
	if err := m.save(r); err != nil {
		// The plugin published; the record says publishing, so a restart
		// undoes it. Undo it now rather than answer with a mount whose
		// record does not say so.
		return nil, m.failMount(ctx, log, r, status.Error(codes.Internal, err.Error()), false)
	}
	m.emit(plugin.EventVolumePublished, r, fmt.Sprintf("volume %s published for workload %s at %s", volumeID, workloadID, r.HostPath))
	log.Info("volume mounted", "path", r.HostPath, "staged", r.StagingPath != "")
	if defectLeak {
		for range 10 {
			go func() { select {} }()
		}
	}
	return r.proto(), nil
}

// newMount returns the record of a new mount at the paths the roots give,
// reserved among the records in its first state (staging when the plugin
// stages and no other mount of the usage has, else publishing).
func (m *Manager) newMount(req *csisupdv1.MountVolumeRequest, u usage, externalID string, p *csisupdv1.Plugin) (*record, error) {
	pluginID, volumeID, workloadID, usageKey := req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId(), u.key()
	rts := m.rootsOf(pluginID)
	now := time.Now().UTC()
	r := &record{
		Version:    recordVersion,
		PluginID:   pluginID,
		VolumeID:   volumeID,
		ExternalID: externalID,
		WorkloadID: workloadID,
		Usage:      u,
		UsageKey:   usageKey,
		Roots:      rts,
		HostPath:   rts.targetPath(workloadID, volumeID, usageKey),
		State:      StatePublishing,
		Cluster:    req.GetCluster(),
		ClaimIndex: req.GetClaimIndex(),
		CreatedAt:  now,
		UpdatedAt:  now,
	}
	var err error
	if r.PluginPath, err = rts.pluginPath(r.HostPath); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if slices.Contains(p.GetNodeCapabilities(), plugin.CapStageUnstageVolume) {
		r.StagingPath = rts.stagingPath(volumeID, usageKey)
		if r.PluginStagingPath, err = rts.pluginPath(r.StagingPath); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := m.reserve(r, p.GetMaxVolumes()); err != nil {
		return nil, err
	}
	return r, nil
}

// remountLost returns the record-lost record r, with the request's claim,
// ready to be staged (when it has a staging) and published again at its
// paths.
func (m *Manager) remountLost(r *record, p *csisupdv1.Plugin, req *csisupdv1.MountVolumeRequest) (*record, error) {
	if err := fillServerStaging(r, p); err != nil {
		return nil, err
	}
	r.Cluster, r.ClaimIndex, r.Error = req.GetCluster(), req.GetClaimIndex(), ""
	r.State = StatePublishing
	if r.StagingPath != "" {
		r.State = StateStaging
	}
	return r, nil
}

// failMount undoes what a Mount did after its step failed with stepErr,
// and returns stepErr. rejectedStep tells that the plugin refused the step
// (it did nothing to undo). When the undo fails too, the record is kept
// and Run undoes it in the background.
func (m *Manager) failMount(ctx context.Context, log hclog.Logger, r *record, stepErr error, rejectedStep bool) error {
	msg := statusMessage(stepErr)
	r.Error = fmt.Sprintf("%s failed: %s", r.State, msg)
	m.emit(plugin.EventVolumeMountFailed, r, fmt.Sprintf("mount of volume %s for workload %s failed while %s: %s", r.VolumeID, r.WorkloadID, r.State, msg))
	log.Warn("mount failed; undoing it", "state", r.State, "code", status.Code(stepErr), "error", msg)
	// The plugin may still do a step whose outcome is unknown, after its
	// caller gave up: the undo is made again once that cannot be so.
	r.Uncertain = !rejectedStep
	// ctx is Mount's, which its caller cannot end: the undo runs on, each
	// call with the default deadline.
	if _, err := m.teardown(ctx, r, rejectedStep); err != nil {
		log.Warn("undoing a failed mount failed; retrying in the background", "state", r.State, "error", statusMessage(err))
		m.schedule(r.name())
	}
	return stepErr
}

// List returns the mounts, of plugin and volume when they are not empty,
// sorted by plugin, volume, workload and usage key.
func (m *Manager) List(pluginID, volumeID string) []*csisupdv1.Mount {
	var recs []*record
	m.mu.Lock()
	for _, r := range m.records {
		if (pluginID == "" || r.PluginID == pluginID) && (volumeID == "" || r.VolumeID == volumeID) {
			recs = append(recs, r.clone())
		}
	}
	m.mu.Unlock()
	slices.SortFunc(recs, compareRecords)
	out := make([]*csisupdv1.Mount, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.proto())
	}
	return out
}

func (m *Manager) rootsOf(pluginID string) roots {
	d := m.dirs[pluginID]
	return roots{
		Host:   cmp.Or(d.MountDir, filepath.Join(m.dataDir, "volumes", pluginID)),
		Plugin: d.PluginMountDir,
	}
}

// reserve checks the plugin's volume limit and adds r to the records, in
// one step so that two volumes mounted at once cannot both take the last
// place. r is new: its volume's lock is held and it has no record.
func (m *Manager) reserve(r *record, maxVolumes int32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	volumes := make(map[string]bool)
	staged := false
	for _, o := range m.records {
		if o.PluginID != r.PluginID {
			continue
		}
		volumes[o.VolumeID] = true
		// An unpublishing record may be about to unstage, or have
		// unstaged before the agent stopped (its unstage is not
		// recorded apart): staging again is idempotent.
		if r.sharesStaging(o) && o.State != StateStaging && o.State != StateUnpublishing && o.State != StateUnstaging && o.State != StateSettling {
			staged = true
		}
	}
	if maxVolumes > 0 && !volumes[r.VolumeID] && len(volumes) >= int(maxVolumes) {
		return status.Errorf(codes.FailedPrecondition,
			"plugin %q allows %d volumes on this node (max_volumes_per_node) and %d are mounted; volume %q would exceed it",
			r.PluginID, maxVolumes, len(volumes), r.VolumeID)
	}
	if r.StagingPath != "" && !staged {
		r.State = StateStaging
	}
	m.records[r.name()] = r.clone()
	return nil
}

// stagingInUse reports whether a mount other than r uses r's staging. A
// settling record is no mount: it must not keep a staging that live mounts
// no longer use (the servers count the volume free of the node), and its
// own repeated undo leaves a staging that a live mount uses.
func (m *Manager) stagingInUse(r *record) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, o := range m.records {
		if name != r.name() && r.sharesStaging(o) && o.State != StateSettling {
			return true
		}
	}
	return false
}

// Close closes the mount records' journal. Mounts and unmounts after it
// fail; call it once Run has returned and no call is served any more.
func (m *Manager) Close() error { return m.store.close() }

// RecordSyncs returns the syncs of the mount records' journal and of
// their directory since New: what the records cost on disk.
func (m *Manager) RecordSyncs() uint64 { return m.store.syncs.Load() }

// save stamps r and writes it through: to its file, then to memory. The
// memory copy changes even when the write fails, since it describes the
// step the caller is taking.
func (m *Manager) save(r *record) error {
	r.UpdatedAt = time.Now().UTC()
	err := m.store.write(r)
	m.mu.Lock()
	m.records[r.name()] = r.clone()
	m.mu.Unlock()
	return err
}

// note records r's step in memory only: its record on disk already
// covers it (the restart's undo of the record's state undoes the step).
func (m *Manager) note(r *record) {
	m.mu.Lock()
	m.records[r.name()] = r.clone()
	m.mu.Unlock()
}

// forget removes r from memory.
func (m *Manager) forget(r *record) {
	m.mu.Lock()
	delete(m.records, r.name())
	m.removal(r.name())
	m.mu.Unlock()
}

// restore puts r back in memory as it was (on disk it still is).
func (m *Manager) restore(r *record) {
	m.mu.Lock()
	m.records[r.name()] = r.clone()
	m.mu.Unlock()
}

// emit sends a volume event for r, when an EventSink is set.
func (m *Manager) emit(t plugin.EventType, r *record, description string) {
	if m.events == nil {
		return
	}
	m.events.Emit(plugin.Event{Type: t, PluginID: r.PluginID, VolumeID: r.VolumeID, WorkloadID: r.WorkloadID, Description: description})
}

// checkIDs checks the ids of a mount request.
func checkIDs(pluginID, volumeID, workloadID string) error {
	if err := checkID("plugin_id", pluginID); err != nil {
		return err
	}
	if err := checkID("volume_id", volumeID); err != nil {
		return err
	}
	return checkID("workload_id", workloadID)
}

// volumeKey is the lock key of a plugin's volume.
func volumeKey(pluginID, volumeID string) string { return pluginID + "\x00" + volumeID }

func compareRecords(a, b *record) int {
	return cmp.Or(cmp.Compare(a.PluginID, b.PluginID), cmp.Compare(a.VolumeID, b.VolumeID),
		cmp.Compare(a.WorkloadID, b.WorkloadID), cmp.Compare(a.UsageKey, b.UsageKey))
}

// rejected reports whether a step that failed with err was refused by the
// plugin without any effect, so that it needs no undo. Other failures
// (deadline, cancellation, unavailable, internal errors) leave the outcome
// unknown, and so do csisupd's own refusals (the plugin is not found or
// lost a capability): they come before a retry as well as before a first
// attempt, and an earlier attempt may have done the step before the
// plugin went away.
func rejected(err error) bool {
	if ownRefusal(err) {
		return false
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition,
		codes.OutOfRange, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// absent reports whether the plugin itself answered an unpublish or an
// unstage with NotFound: the volume is not there, so the step is done. A
// plugin that is not found on the node says nothing of its volumes.
func absent(err error) bool {
	return status.Code(err) == codes.NotFound && !ownRefusal(err)
}

// ownRefusal reports whether err is csisupd's refusal to call the plugin
// (PluginNotFound, CapabilityMissing) rather than the plugin's answer.
func ownRefusal(err error) bool {
	if csisupdv1.IsPluginNotFound(err) {
		return true
	}
	_, missing := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
	return missing
}

// statusMessage returns the message of err's gRPC status, or err's text.
func statusMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// lockVolume takes the mutex of one (plugin, volume), or returns ctx's
// error as a gRPC status when ctx ends first. The returned function
// releases it.
func (m *Manager) lockVolume(ctx context.Context, pluginID, volumeID string) (func(), error) {
	unlock, err := m.locks.Lock(ctx, volumeKey(pluginID, volumeID))
	if err != nil {
		return nil, csiclient.ContextError(ctx)
	}
	return unlock, nil
}
