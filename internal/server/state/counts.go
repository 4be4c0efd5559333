package state

import "github.com/csisupd/csisupd/internal/server/statepb"

// Counts is what the metrics count in the state.
type Counts struct {
	// Nodes counts the nodes by stored status; a status no node has is
	// absent.
	Nodes map[string]int
	// Plugins counts the plugin ids.
	Plugins int
	// Volumes counts the volumes.
	Volumes int
	// Claims counts the claims by state; a state no claim is in is
	// absent.
	Claims map[string]int
	// Expansions counts the volumes with an expansion under way, by
	// expansion state.
	Expansions map[string]int
	// Snapshots counts the volume snapshots by state; created snapshots
	// not yet ready to use are counted under "created-not-ready".
	Snapshots map[string]int
	// Abnormal counts the volumes with an abnormal condition; Paused and
	// Draining the volumes an operator keeps from new claims.
	Abnormal, Paused, Draining int
}

// SnapshotNotReady is the Counts.Snapshots key of created snapshots that
// are not ready to use yet.
const SnapshotNotReady = "created-not-ready"

// Counts counts nodes, plugin ids, volumes and claims in one read
// transaction, without copying any object.
func (s *Store) Counts() Counts {
	out := Counts{Nodes: map[string]int{}, Claims: map[string]int{}, Expansions: map[string]int{}, Snapshots: map[string]int{}}
	txn := s.db.Txn(false)
	if it, err := txn.Get(tableNodes, "id"); err == nil {
		for raw := it.Next(); raw != nil; raw = it.Next() {
			out.Nodes[raw.(*statepb.ClusterNode).GetStatus()]++
		}
	}
	// The rows of one plugin are adjacent: the index sorts by plugin id,
	// then node id.
	if it, err := txn.Get(tablePlugins, "id"); err == nil {
		last := ""
		for raw := it.Next(); raw != nil; raw = it.Next() {
			if id := raw.(*instanceRow).PluginID; out.Plugins == 0 || id != last {
				out.Plugins++
				last = id
			}
		}
	}
	if it, err := txn.Get(tableVolumes, "id"); err == nil {
		for raw := it.Next(); raw != nil; raw = it.Next() {
			out.Volumes++
			v := raw.(*statepb.Volume)
			for _, c := range v.GetClaims() {
				out.Claims[c.GetState()]++
			}
			if e := v.GetExpansion(); e != nil {
				out.Expansions[e.GetState()]++
			}
			if len(v.GetConditions()) > 0 {
				out.Abnormal++
			}
			// "pause" and "drain" are the claims package's availabilities.
			switch v.GetAvailability() {
			case "pause":
				out.Paused++
			case "drain":
				out.Draining++
			}
		}
	}
	if it, err := txn.Get(tableVolumeSnapshots, "id"); err == nil {
		for raw := it.Next(); raw != nil; raw = it.Next() {
			snap := raw.(*statepb.VolumeSnapshot)
			st := snap.GetState()
			// "created" is rules.SnapshotCreated, which this package cannot
			// import.
			if st == "created" && !snap.GetReadyToUse() {
				st = SnapshotNotReady
			}
			out.Snapshots[st]++
		}
	}
	return out
}
