package fsm

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// apply applies one log entry to txn and appends the events it causes;
// index and term are those of the raft entry that holds it.
func (f *FSM) apply(txn *state.Txn, index, term uint64, e *statepb.LogEntry, events *[]*csisupdv1.ClusterEvent) error {
	ts := e.GetTime()
	ev := func(typ, node, plugin, volume, desc string) {
		*events = append(*events, &csisupdv1.ClusterEvent{
			Index: index, Time: ts, Type: typ,
			NodeId: node, PluginId: plugin, VolumeId: volume, Description: desc,
		})
	}
	switch c := e.GetCommand().(type) {
	case *statepb.LogEntry_Batch:
		var firstErr error
		for _, sub := range c.Batch.GetEntries() {
			if err := f.apply(txn, index, term, sub, events); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		return firstErr
	case *statepb.LogEntry_Noop:
		return nil
	case *statepb.LogEntry_NodeUpsert:
		n := c.NodeUpsert
		n.Plugins = sortedPlugins(n.Plugins)
		n.ModifyIndex = index
		n.CreateIndex = index
		n.Status = state.NodeStatusReady
		n.StatusUpdatedAt = ts
		n.RegisteredAt = ts
		old := txn.Node(n.GetId())
		var replaced *statepb.ClusterNode
		if len(n.GetSecretHash()) > 0 {
			// Entries of earlier releases carry no secret and are applied
			// as those releases applied them.
			var err error
			if replaced, err = rules.CheckNodeRegister(n.GetId(), n.GetName(), n.GetSecretHash(), old, txn.NodesNamed(n.GetName())); err != nil {
				return err
			}
		} else if old != nil {
			n.SecretHash, n.Rekeyed = old.GetSecretHash(), old.GetRekeyed()
		}
		var oldPlugins []*statepb.Plugin
		if old != nil {
			n.CreateIndex = old.GetCreateIndex()
			oldPlugins = old.GetPlugins()
			// The operator's drains outlive the agent's registrations.
			n.DrainingPlugins = old.GetDrainingPlugins()
		}
		if err := txn.PutNode(n); err != nil {
			return err
		}
		if replaced != nil {
			r := state.CopyNode(replaced)
			r.ReplacedBy = n.GetId()
			r.Status = state.NodeStatusDown
			r.StatusDescription = fmt.Sprintf("rekeyed and replaced by node %s", n.GetId())
			r.StatusUpdatedAt = ts
			r.ModifyIndex = index
			if err := txn.PutNode(r); err != nil {
				return err
			}
			ev("node-replaced", r.GetId(), "", "", fmt.Sprintf("node %s (%s) was rekeyed and is replaced by node %s", r.GetId(), r.GetName(), n.GetId()))
		}
		gc, err := txn.SetNodePlugins(n.GetId(), oldPlugins, n.Plugins)
		if err != nil {
			return err
		}
		ev("node-registered", n.GetId(), "", "", fmt.Sprintf("node %s registered with %d plugins", n.GetName(), len(n.Plugins)))
		for _, id := range gc {
			ev("plugin-gc", n.GetId(), id, "", "plugin has no instances left")
		}
	case *statepb.LogEntry_NodePlugins:
		old := txn.Node(c.NodePlugins.GetNodeId())
		if old == nil {
			return fmt.Errorf("node %q: %w", c.NodePlugins.GetNodeId(), state.ErrNotFound)
		}
		n := state.CopyNode(old)
		n.Plugins = sortedPlugins(c.NodePlugins.GetPlugins())
		n.ModifyIndex = index
		if err := txn.PutNode(n); err != nil {
			return err
		}
		gc, err := txn.SetNodePlugins(n.GetId(), old.GetPlugins(), n.Plugins)
		if err != nil {
			return err
		}
		ev("node-plugins-updated", n.GetId(), "", "", fmt.Sprintf("%d plugins", len(n.Plugins)))
		for _, id := range gc {
			ev("plugin-gc", n.GetId(), id, "", "plugin has no instances left")
		}
	case *statepb.LogEntry_NodeRekey:
		old := txn.Node(c.NodeRekey.GetNodeId())
		if old == nil {
			return fmt.Errorf("node %q: %w", c.NodeRekey.GetNodeId(), state.ErrNotFound)
		}
		n := state.CopyNode(old)
		n.SecretHash, n.Rekeyed = nil, true
		n.ModifyIndex = index
		if err := txn.PutNode(n); err != nil {
			return err
		}
		ev("node-rekeyed", n.GetId(), "", "", fmt.Sprintf("node %s (%s) rekeyed: the next agent to register as it sets its secret", n.GetId(), n.GetName()))
	case *statepb.LogEntry_NodeStatus:
		old := txn.Node(c.NodeStatus.GetNodeId())
		if old == nil {
			return fmt.Errorf("node %q: %w", c.NodeStatus.GetNodeId(), state.ErrNotFound)
		}
		if old.GetStatus() == c.NodeStatus.GetStatus() {
			return nil
		}
		n := state.CopyNode(old)
		n.Status = c.NodeStatus.GetStatus()
		n.StatusDescription = c.NodeStatus.GetDescription()
		n.StatusUpdatedAt = ts
		n.ModifyIndex = index
		if err := txn.PutNode(n); err != nil {
			return err
		}
		ev("node-"+n.Status, n.GetId(), "", "", n.StatusDescription)
	case *statepb.LogEntry_VolumeUpsert:
		// Written by earlier releases only: applied as they applied it.
		v := c.VolumeUpsert
		// A claim is given the index of the write that added it.
		for _, cl := range v.GetClaims() {
			if cl.GetClaimIndex() == 0 {
				cl.ClaimIndex = index
			}
		}
		return putVolume(txn, index, ts, txn.Volume(v.GetId()), v, ev)
	case *statepb.LogEntry_VolumeDelete:
		// Written by earlier releases only; a volume with claims is kept.
		return deleteVolume(txn, &statepb.VolumeDeleteCommand{VolumeId: c.VolumeDelete}, ev)
	case *statepb.LogEntry_PluginDrain:
		return applyPluginDrain(txn, index, c.PluginDrain, ev)
	case *statepb.LogEntry_ClaimTake, *statepb.LogEntry_ClaimStep, *statepb.LogEntry_ClaimRemove:
		return f.applyClaimCommand(txn, index, term, ts, c, ev)
	case *statepb.LogEntry_VolumeCreate, *statepb.LogEntry_VolumeDeleteChecked, *statepb.LogEntry_VolumeExpand,
		*statepb.LogEntry_VolumeModify, *statepb.LogEntry_VolumeAvailability, *statepb.LogEntry_VolumeHealth:
		return f.applyVolumeCommand(txn, index, ts, c, ev)
	case *statepb.LogEntry_SnapshotPut, *statepb.LogEntry_SnapshotDelete:
		return applySnapshotCommand(txn, index, ts, c, func(e *csisupdv1.ClusterEvent) {
			e.Index, e.Time = index, ts
			*events = append(*events, e)
		})
	case *statepb.LogEntry_AclPolicyUpsert, *statepb.LogEntry_AclPolicyDelete, *statepb.LogEntry_AclTokenUpsert,
		*statepb.LogEntry_AclTokenDelete, *statepb.LogEntry_AclBootstrap:
		return applyACL(txn, index, ts, c)
	case *statepb.LogEntry_ServerUpsert:
		if err := txn.PutServer(c.ServerUpsert); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown log entry command %T", c)
	}
	return nil
}

// volumeEvent is one event of a volume update.
type volumeEvent struct {
	typ, nodeID, desc string
}

// volumeChanges names the events of a volume update: volume-claimed for
// each claim added, volume-claim-updated for each claim changed,
// volume-claim-freed for each claim removed, and volume-updated when no
// claim changed. Claims are matched by node and workload.
func volumeChanges(old, new *statepb.Volume) []volumeEvent {
	type key struct{ node, workload string }
	before := make(map[key]*statepb.VolumeClaim, len(old.GetClaims()))
	for _, c := range old.GetClaims() {
		before[key{c.GetNodeId(), c.GetWorkloadId()}] = c
	}
	var out []volumeEvent
	for _, c := range new.GetClaims() {
		k := key{c.GetNodeId(), c.GetWorkloadId()}
		prev, had := before[k]
		delete(before, k)
		switch {
		case !had:
			out = append(out, volumeEvent{"volume-claimed", c.GetNodeId(), claimDescription("claimed", c)})
		case !proto.Equal(prev, c):
			out = append(out, volumeEvent{"volume-claim-updated", c.GetNodeId(), claimDescription("updated", c)})
		}
	}
	for _, c := range old.GetClaims() {
		if _, gone := before[key{c.GetNodeId(), c.GetWorkloadId()}]; gone {
			out = append(out, volumeEvent{"volume-claim-freed", c.GetNodeId(),
				fmt.Sprintf("claim of workload %s on node %s freed", c.GetWorkloadId(), c.GetNodeId())})
		}
	}
	if len(out) == 0 {
		out = append(out, volumeEvent{typ: "volume-updated"})
	}
	return out
}

// claimDescription describes a claim for an event: node, workload, state
// and what is done. It holds no secret: a claim has none.
func claimDescription(what string, c *statepb.VolumeClaim) string {
	d := fmt.Sprintf("claim of workload %s on node %s %s: state %s, %s %s",
		c.GetWorkloadId(), c.GetNodeId(), what, c.GetState(), c.GetUsage().GetAccessMode(), rules.RW(c.GetReadOnly()))
	if c.GetControllerPublished() {
		d += ", controller published"
	}
	if c.GetMounted() {
		d += ", mounted"
	}
	if c.GetNodeGone() {
		d += ", released without its node"
	}
	if c.GetLastError() != "" {
		d += ", last error: " + c.GetLastError()
	}
	return d
}

// sortedPlugins sorts plugins by id in place and returns them. The FSM owns
// the messages of a freshly decoded log entry, so they are not copied.
func sortedPlugins(in []*statepb.Plugin) []*statepb.Plugin {
	sort.Slice(in, func(i, j int) bool { return in[i].GetId() < in[j].GetId() })
	return in
}
