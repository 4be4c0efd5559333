package csisupdv1

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestTypedErrors(t *testing.T) {
	plain := status.Error(codes.NotFound, "volume not found")
	tests := []struct {
		name                                 string
		err                                  error
		code                                 codes.Code
		retryable, ignorable, pluginNotFound bool
	}{
		{"nil", nil, codes.OK, false, false, false},
		{"not a status", errors.New("plugin \"p\" is not registered"), codes.Unknown, false, false, false},
		{"plain status", plain, codes.NotFound, false, false, false},
		{"plugin not found", NewPluginNotFoundError("p", "n1"), codes.NotFound, true, false, true},
		{"wrapped plugin not found", fmt.Errorf("calling node n1: %w", NewPluginNotFoundError("p", "")), codes.NotFound, true, false, true},
		{"plugin unhealthy", NewPluginUnhealthyError("p", "unhealthy", "probe failed"), codes.Unavailable, true, false, false},
		{"capability missing", NewCapabilityMissingError("p", "ControllerAttachVolume", "PUBLISH_UNPUBLISH_VOLUME"), codes.FailedPrecondition, false, false, false},
		{"node capability missing", NewNodeCapabilityMissingError("p", "n1", "ClaimVolume", "VOLUME_MOUNT_GROUP"), codes.FailedPrecondition, false, false, false},
		{"marked ignorable", MarkIgnorable(plain, "already gone"), codes.NotFound, false, true, false},
		{"marked retryable", MarkRetryable(status.Error(codes.Aborted, "conflict"), "try again"), codes.Aborted, true, false, false},
		{"marked twice", MarkRetryable(MarkIgnorable(plain, "gone"), "again"), codes.NotFound, true, true, false},
		{"events fell behind", NewEventsFellBehindError(7, 600, 512), codes.ResourceExhausted, false, false, false},
		{"events gone", NewEventsGoneError(7, 1200), codes.OutOfRange, false, false, false},
		{"claim refused", NewClaimRefusedError(ClaimRuleTopology, "not reachable from node n1"), codes.FailedPrecondition, false, false, false},
		{"claim deferred", NewClaimDeferredError(ClaimRuleNodeNotReady, "node n1 is initializing", "its next heartbeat"), codes.Unavailable, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := status.Code(tt.err); got != tt.code {
				t.Errorf("code = %s, want %s", got, tt.code)
			}
			if got := IsRetryable(tt.err); got != tt.retryable {
				t.Errorf("IsRetryable = %t, want %t", got, tt.retryable)
			}
			if got := IsIgnorable(tt.err); got != tt.ignorable {
				t.Errorf("IsIgnorable = %t, want %t", got, tt.ignorable)
			}
			if got := IsPluginNotFound(tt.err); got != tt.pluginNotFound {
				t.Errorf("IsPluginNotFound = %t, want %t", got, tt.pluginNotFound)
			}
		})
	}
}

func TestMarkKeepsStatus(t *testing.T) {
	orig := NewCapabilityMissingError("p", "ControllerCreateVolume", "CREATE_DELETE_VOLUME")
	marked := MarkIgnorable(orig, "why")
	st, ost := status.Convert(marked), status.Convert(orig)
	if st.Code() != ost.Code() || st.Message() != ost.Message() {
		t.Errorf("marked = %s %q, want %s %q", st.Code(), st.Message(), ost.Code(), ost.Message())
	}
	d, ok := ErrorDetail[*CapabilityMissing](marked)
	if !ok || d.GetCapability() != "CREATE_DELETE_VOLUME" || d.GetMethod() != "ControllerCreateVolume" {
		t.Errorf("CapabilityMissing detail = %v after marking", d)
	}
	if got := MarkIgnorable(nil, "x"); got != nil {
		t.Errorf("MarkIgnorable(nil) = %v", got)
	}
}

func TestErrorMessages(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{NewPluginNotFoundError("p1", "node-a"), `plugin "p1" is not registered on node "node-a"`},
		{NewPluginNotFoundError("p1", ""), `plugin "p1" is not registered`},
		{NewPluginUnhealthyError("p1", "unhealthy", "probe: connection refused"), `plugin "p1" is unhealthy: probe: connection refused`},
		{NewCapabilityMissingError("p1", "ControllerExpandVolume", "EXPAND_VOLUME"), `plugin "p1" does not advertise the EXPAND_VOLUME capability that ControllerExpandVolume needs`},
		{NewNodeCapabilityMissingError("p1", "n1", "ClaimVolume", "VOLUME_MOUNT_GROUP"), `plugin "p1" on node "n1" does not advertise the VOLUME_MOUNT_GROUP node capability that ClaimVolume needs`},
		{NewEventsFellBehindError(7, 600, 512), "fell behind: 600 events behind the newest (at most 512); resume from index 7"},
		{NewEventsGoneError(7, 1200), "events after index 7 are no longer buffered (the oldest is 1200): read the state again, then follow the newest events"},
		{NewClaimRefusedError(ClaimRuleTopology, "not reachable from node n1"), "claim refused (topology): not reachable from node n1"},
		{NewClaimDeferredError(ClaimRuleNodeNotReady, "node n1 is initializing", "its next heartbeat"), "claim refused (node-not-ready): node n1 is initializing"},
		{NewNoLeaderError("s1", "leadership lost"), "server s1: no cluster leader (leadership lost)"},
		{NewNoLeaderError("", "node is not the leader"), "no cluster leader (node is not the leader)"},
		{NewNodeUnreachableError("n2", "10.0.0.2:4780", status.Error(codes.Unavailable, "connection refused")),
			`node "n2": its agent at 10.0.0.2:4780 cannot be reached: connection refused`},
	}
	for _, tt := range tests {
		if got := status.Convert(tt.err).Message(); got != tt.want {
			t.Errorf("message = %q, want %q", got, tt.want)
		}
	}
}

func TestNodeUnreachableDetails(t *testing.T) {
	err := NewNodeUnreachableError("n2", "10.0.0.2:4780", status.Error(codes.Unavailable, "connection refused"))
	d, ok := ErrorDetail[*NodeUnreachable](err)
	if !ok || d.GetNodeId() != "n2" || d.GetAddress() != "10.0.0.2:4780" || d.GetReason() != "connection refused" {
		t.Fatalf("NodeUnreachable detail = %v, %v", d, ok)
	}
	if status.Code(err) != codes.Unavailable || !IsRetryable(err) {
		t.Errorf("code %s, retryable %v; want Unavailable and retryable", status.Code(err), IsRetryable(err))
	}
}

func TestEventErrorDetails(t *testing.T) {
	fb, ok := ErrorDetail[*EventsFellBehind](fmt.Errorf("watch: %w", NewEventsFellBehindError(7, 600, 512)))
	if !ok || fb.GetResumeIndex() != 7 || fb.GetLag() != 600 || fb.GetMaxLag() != 512 {
		t.Errorf("EventsFellBehind = %v, want resume 7, lag 600 of 512", fb)
	}
	g, ok := ErrorDetail[*EventsGone](NewEventsGoneError(7, 1200))
	if !ok || g.GetAfter() != 7 || g.GetOldestIndex() != 1200 {
		t.Errorf("EventsGone = %v, want after 7, oldest 1200", g)
	}
}

func TestNodeCapabilityMissingDetail(t *testing.T) {
	err := NewNodeCapabilityMissingError("p1", "n1", "MountVolume", "VOLUME_MOUNT_GROUP")
	d, ok := ErrorDetail[*CapabilityMissing](err)
	if !ok {
		t.Fatalf("error %v has no CapabilityMissing detail", err)
	}
	if d.GetPluginId() != "p1" || d.GetNode() != "n1" || d.GetMethod() != "MountVolume" || d.GetCapability() != "VOLUME_MOUNT_GROUP" {
		t.Errorf("detail = %v, want plugin p1, node n1, method MountVolume, capability VOLUME_MOUNT_GROUP", d)
	}
}
