package rules

import (
	"cmp"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// HealthSourceController is the source of the conditions the plugin's
// controllers report (ControllerListVolumeHealth); a node's conditions
// have the node id as their source.
const HealthSourceController = "controller"

// MaxHealthMessage caps a stored condition's message: it comes from a
// plugin.
const MaxHealthMessage = plugin.MaxConditionMessage

// Condition returns v's condition from source, or nil when it is normal.
func Condition(v *statepb.Volume, source string) *statepb.VolumeCondition {
	for _, c := range v.GetConditions() {
		if c.GetSource() == source {
			return c
		}
	}
	return nil
}

// HealthChanged reports whether recording what source reports (abnormal
// with message, or normal) would change v: the leader proposes only
// changes, so that a steady state writes nothing.
func HealthChanged(v *statepb.Volume, source string, abnormal bool, message string) bool {
	c := Condition(v, source)
	if !abnormal {
		return c != nil
	}
	return c == nil || c.GetMessage() != plugin.CapConditionMessage(message)
}

// CheckHealth checks a volume_health command against v as stored.
func CheckHealth(v *statepb.Volume, cmd *statepb.VolumeHealthCommand) error {
	if cmd.GetSource() == "" {
		return status.Errorf(codes.InvalidArgument, "volume %q: a health report needs its source", v.GetId())
	}
	if len(cmd.GetMessage()) > MaxHealthMessage {
		return status.Errorf(codes.InvalidArgument, "volume %q: health message of %d bytes is over %d", v.GetId(), len(cmd.GetMessage()), MaxHealthMessage)
	}
	return nil
}

// ApplyHealth returns the conditions of v after cmd, applied at now: the
// source's condition set (its since kept while it stays abnormal) or
// removed.
func ApplyHealth(v *statepb.Volume, cmd *statepb.VolumeHealthCommand, now *timestamppb.Timestamp) []*statepb.VolumeCondition {
	out := slices.DeleteFunc(slices.Clone(v.GetConditions()), func(c *statepb.VolumeCondition) bool { return c.GetSource() == cmd.GetSource() })
	if !cmd.GetAbnormal() {
		return out
	}
	since := now
	if old := Condition(v, cmd.GetSource()); old != nil {
		since = proto.Clone(old.GetSince()).(*timestamppb.Timestamp)
	}
	out = append(out, &statepb.VolumeCondition{Source: cmd.GetSource(), Message: cmd.GetMessage(), Since: since})
	slices.SortFunc(out, func(a, b *statepb.VolumeCondition) int { return cmp.Compare(a.GetSource(), b.GetSource()) })
	return out
}

// HealthEvent names the event of a health change and describes it.
func HealthEvent(cmd *statepb.VolumeHealthCommand) (typ, desc string) {
	if cmd.GetAbnormal() {
		return "volume-abnormal", fmt.Sprintf("%s reports the volume abnormal: %s", cmd.GetSource(), cmd.GetMessage())
	}
	return "volume-normal", fmt.Sprintf("%s reports the volume normal", cmd.GetSource())
}

// NodeConditionsLeft returns v's conditions without node's once v has no
// claim left on node: a node that no longer mounts the volume reports
// nothing of it, and its last word would stay forever.
func NodeConditionsLeft(v *statepb.Volume, node string) []*statepb.VolumeCondition {
	if slices.ContainsFunc(v.GetClaims(), func(c *statepb.VolumeClaim) bool { return c.GetNodeId() == node }) {
		return v.GetConditions()
	}
	return slices.DeleteFunc(slices.Clone(v.GetConditions()), func(c *statepb.VolumeCondition) bool { return c.GetSource() == node })
}
