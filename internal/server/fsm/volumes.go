package fsm

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// eventFunc appends one event of the entry being applied.
type eventFunc func(typ, node, plugin, volume, desc string)

// applyVolumeCommand applies one typed volume command other than a
// claim's (applyClaimCommand): it checks the command against the state
// the transaction reads, with the same rules the leader used to build it
// (package rules), and refuses it with the error the caller sees,
// changing nothing, when it no longer holds. So does applyClaimCommand.
func (f *FSM) applyVolumeCommand(txn *state.Txn, index uint64, ts *timestamppb.Timestamp, cmd any, ev eventFunc) error {
	switch c := cmd.(type) {
	case *statepb.LogEntry_VolumeCreate:
		v := c.VolumeCreate.GetVolume()
		if err := rules.CheckCreate(txn.Volume(v.GetId()), v); err != nil {
			return err
		}
		return putVolume(txn, index, ts, nil, v, ev)
	case *statepb.LogEntry_VolumeDeleteChecked:
		return deleteVolume(txn, c.VolumeDeleteChecked, ev)
	case *statepb.LogEntry_VolumeExpand:
		return expandVolume(txn, index, c.VolumeExpand, ev)
	case *statepb.LogEntry_VolumeModify:
		v, err := volumeOf(txn, c.VolumeModify.GetVolumeId())
		if err != nil {
			return err
		}
		if err := rules.CheckModify(v, c.VolumeModify); err != nil {
			return err
		}
		nv := proto.Clone(v).(*statepb.Volume)
		nv.MutableParameters = rules.MergeMutable(v.GetMutableParameters(), c.VolumeModify.GetMutableParameters())
		if err := replaceVolume(txn, index, v, nv); err != nil {
			return err
		}
		ev("volume-modified", "", nv.GetPluginId(), nv.GetId(), "mutable parameters set: "+strings.Join(slices.Sorted(maps.Keys(c.VolumeModify.GetMutableParameters())), ", "))
		return nil
	case *statepb.LogEntry_VolumeAvailability:
		v, err := volumeOf(txn, c.VolumeAvailability.GetVolumeId())
		if err != nil {
			return err
		}
		to := c.VolumeAvailability.GetAvailability()
		if err := rules.CheckSetAvailability(v, to); err != nil {
			return err
		}
		if v.GetAvailability() == to {
			return nil
		}
		nv := proto.Clone(v).(*statepb.Volume)
		nv.Availability = to
		if err := replaceVolume(txn, index, v, nv); err != nil {
			return err
		}
		ev("volume-availability", "", nv.GetPluginId(), nv.GetId(), fmt.Sprintf("availability %s (was %s)",
			rules.AvailabilityName(to), rules.AvailabilityName(v.GetAvailability())))
		return nil
	case *statepb.LogEntry_VolumeHealth:
		cmd := c.VolumeHealth
		v, err := volumeOf(txn, cmd.GetVolumeId())
		if err != nil {
			return err
		}
		if err := rules.CheckHealth(v, cmd); err != nil {
			return err
		}
		if !rules.HealthChanged(v, cmd.GetSource(), cmd.GetAbnormal(), cmd.GetMessage()) {
			return nil // a report another leader already recorded
		}
		nv := proto.Clone(v).(*statepb.Volume)
		nv.Conditions = rules.ApplyHealth(v, cmd, ts)
		if err := replaceVolume(txn, index, v, nv); err != nil {
			return err
		}
		typ, desc := rules.HealthEvent(cmd)
		node := ""
		if cmd.GetSource() != rules.HealthSourceController {
			node = cmd.GetSource()
		}
		ev(typ, node, nv.GetPluginId(), nv.GetId(), desc)
		return nil
	}
	return fmt.Errorf("unknown volume command %T", cmd)
}

// volumeOf returns the stored volume a command names.
func volumeOf(txn *state.Txn, id string) (*statepb.Volume, error) {
	v := txn.Volume(id)
	if v == nil {
		return nil, fmt.Errorf("volume %q: %w", id, state.ErrNotFound)
	}
	return v, nil
}

// expandVolume applies a volume_expand command: the next state of an
// expansion, with volume-expanded when it is done.
func expandVolume(txn *state.Txn, index uint64, cmd *statepb.VolumeExpandCommand, ev eventFunc) error {
	v, err := volumeOf(txn, cmd.GetVolumeId())
	if err != nil {
		return err
	}
	if err := rules.CheckExpandStep(v, cmd); err != nil {
		return err
	}
	nv := proto.Clone(v).(*statepb.Volume)
	rules.ApplyExpandStep(nv, cmd)
	if err := replaceVolume(txn, index, v, nv); err != nil {
		return err
	}
	switch e := nv.GetExpansion(); {
	case e == nil && nv.GetCapacityBytes() < v.GetExpansion().GetCapacityBytes():
		ev("volume-updated", "", nv.GetPluginId(), nv.GetId(), fmt.Sprintf("expansion to %d bytes abandoned at %d bytes: %s",
			v.GetExpansion().GetCapacityBytes(), nv.GetCapacityBytes(), v.GetExpansion().GetLastError()))
	case e == nil:
		ev("volume-expanded", "", nv.GetPluginId(), nv.GetId(), fmt.Sprintf("expanded to %d bytes (was %d)", nv.GetCapacityBytes(), v.GetCapacityBytes()))
	default:
		desc := fmt.Sprintf("expansion to %d bytes: state %s", e.GetCapacityBytes(), e.GetState())
		if len(e.GetNodesPending()) > 0 {
			desc += ", nodes pending: " + strings.Join(e.GetNodesPending(), ", ")
		}
		if e.GetLastError() != "" {
			desc += ", last error: " + e.GetLastError()
		}
		ev("volume-updated", "", nv.GetPluginId(), nv.GetId(), desc)
	}
	return nil
}

// replaceVolume writes nv, the new row of the stored volume old, at index.
func replaceVolume(txn *state.Txn, index uint64, old, nv *statepb.Volume) error {
	nv.ModifyIndex = index
	nv.CreateIndex = old.GetCreateIndex()
	nv.CreatedAt = old.GetCreatedAt()
	return txn.PutVolume(nv)
}

// putVolume writes nv, the new row of a volume whose stored row is old
// (nil for a new volume), at index, and appends the events of the change.
func putVolume(txn *state.Txn, index uint64, ts *timestamppb.Timestamp, old, nv *statepb.Volume, ev eventFunc) error {
	nv.ModifyIndex = index
	var changes []volumeEvent
	if old != nil {
		nv.CreateIndex = old.GetCreateIndex()
		nv.CreatedAt = old.GetCreatedAt()
		changes = volumeChanges(old, nv)
	} else {
		nv.CreateIndex = index
		if nv.CreatedAt == nil {
			nv.CreatedAt = ts
		}
		changes = []volumeEvent{{typ: "volume-created"}}
	}
	if err := txn.PutVolume(nv); err != nil {
		return err
	}
	for _, ch := range changes {
		ev(ch.typ, ch.nodeID, nv.GetPluginId(), nv.GetId(), ch.desc)
	}
	return nil
}

// deleteVolume removes the volume of cmd, which has no claims unless cmd
// is forced. A volume_index other than 0 must be the volume's modify
// index: the leader decided on that row.
func deleteVolume(txn *state.Txn, cmd *statepb.VolumeDeleteCommand, ev eventFunc) error {
	v, err := volumeOf(txn, cmd.GetVolumeId())
	if err != nil {
		return err
	}
	if err := rules.CheckDelete(v, cmd); err != nil {
		return err
	}
	if err := rules.CheckDeleteWithSnapshots(v, txn.VolumeSnapshots()); err != nil {
		return err
	}
	if err := txn.DeleteVolume(v); err != nil {
		return err
	}
	desc := ""
	if n := len(v.GetClaims()); n > 0 {
		desc = fmt.Sprintf("deregistered by force with %d claims left: %s", n, rules.Describe(v.GetClaims()))
	}
	ev("volume-deleted", "", v.GetPluginId(), v.GetId(), desc)
	return nil
}

// applyPluginDrain starts or ends the drain of a plugin on a node.
func applyPluginDrain(txn *state.Txn, index uint64, cmd *statepb.PluginDrainCommand, ev eventFunc) error {
	old := txn.Node(cmd.GetNodeId())
	if old == nil {
		return fmt.Errorf("node %q: %w", cmd.GetNodeId(), state.ErrNotFound)
	}
	if cmd.GetPluginId() == "" {
		return fmt.Errorf("plugin drain on node %q: plugin_id is required", cmd.GetNodeId())
	}
	draining := slices.Contains(old.GetDrainingPlugins(), cmd.GetPluginId())
	if draining == cmd.GetDraining() {
		return nil
	}
	n := state.CopyNode(old)
	n.DrainingPlugins = slices.Clone(n.DrainingPlugins) // the stored row's is shared
	if cmd.GetDraining() {
		n.DrainingPlugins = append(n.DrainingPlugins, cmd.GetPluginId())
		slices.Sort(n.DrainingPlugins)
	} else {
		n.DrainingPlugins = slices.DeleteFunc(n.DrainingPlugins, func(id string) bool { return id == cmd.GetPluginId() })
	}
	n.ModifyIndex = index
	if err := txn.PutNode(n); err != nil {
		return err
	}
	if cmd.GetDraining() {
		ev("plugin-draining", n.GetId(), cmd.GetPluginId(), "", "new claims of the plugin's volumes on the node are refused")
	} else {
		ev("plugin-drain-ended", n.GetId(), cmd.GetPluginId(), "", "the node takes new claims of the plugin's volumes again")
	}
	return nil
}
