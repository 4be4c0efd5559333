package nodevolumes

import (
	"context"
	"maps"
	"slices"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// reportedHealth is what the node last reported of a volume's health.
type reportedHealth struct {
	abnormal bool
	message  string
}

// healthLoop asks, every health interval, the health of each published
// cluster mount whose plugin has the GET_VOLUME_HEALTH node capability,
// and reports to the servers what changed since it last reported. A
// report that fails is made again at the next round. The first round
// reports every volume once: the servers drop what they already hold.
func (m *Manager) healthLoop(ctx context.Context) {
	loop := m.watchdog.Loop("volume health")
	defer loop.Done()
	reported := map[string]reportedHealth{}
	for {
		m.healthRound(ctx, reported)
		if loop.Wait(ctx, m.healthIn) != nil {
			return
		}
	}
}

// healthRound is one round of healthLoop; reported is what was reported
// of each volume, by volume id.
func (m *Manager) healthRound(ctx context.Context, reported map[string]reportedHealth) {
	mounts := map[string]*record{} // by volume: one published mount of it
	m.mu.Lock()
	for _, r := range m.records {
		if r.Cluster && r.State == StatePublished {
			if cur, ok := mounts[r.VolumeID]; !ok || compareRecords(r, cur) < 0 {
				mounts[r.VolumeID] = r.clone()
			}
		}
	}
	m.mu.Unlock()
	for id := range reported {
		if _, ok := mounts[id]; !ok {
			delete(reported, id) // unmounted: the servers drop the node's word with its last claim
		}
	}
	for _, id := range slices.Sorted(maps.Keys(mounts)) {
		if ctx.Err() != nil {
			return
		}
		r := mounts[id]
		if _, err := m.resolve(r.PluginID, methodVolumeHealth, plugin.CapGetVolumeHealth); err != nil {
			continue // the plugin cannot say, or is away
		}
		resp, err := m.VolumeHealth(ctx, &csisupdv1.VolumeHealthRequest{PluginId: r.PluginID, VolumeId: r.VolumeID, WorkloadId: r.WorkloadID})
		if err != nil {
			m.log.Debug("volume health not read", "plugin", r.PluginID, "volume", r.VolumeID, "error", statusMessage(err))
			continue
		}
		abnormal, msg := plugin.VolumeCondition(resp.GetResponse().GetVolumeHealth())
		now := reportedHealth{abnormal: abnormal, message: msg}
		if last, ok := reported[id]; ok && last == now {
			continue
		}
		if err := m.health(ctx, id, abnormal, msg); err != nil {
			m.log.Warn("report volume health to the servers", "volume", id, "abnormal", abnormal, "error", err)
			delete(reported, id)
			continue
		}
		if abnormal {
			m.log.Warn("volume abnormal", "plugin", r.PluginID, "volume", id, "condition", msg)
		}
		reported[id] = now
	}
}
