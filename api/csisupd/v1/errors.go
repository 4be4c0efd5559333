package csisupdv1

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
)

// IsRetryable reports whether err carries a Retryable detail: the same
// request may succeed on another node, or on this node later.
func IsRetryable(err error) bool {
	_, ok := ErrorDetail[*Retryable](err)
	return ok
}

// IsIgnorable reports whether err carries an Ignorable detail: the system is
// already as the request wanted it, and the caller may treat the request as
// done.
func IsIgnorable(err error) bool {
	_, ok := ErrorDetail[*Ignorable](err)
	return ok
}

// IsPluginNotFound reports whether err carries a PluginNotFound detail: no
// plugin with the requested id runs on the node that answered.
func IsPluginNotFound(err error) bool {
	_, ok := ErrorDetail[*PluginNotFound](err)
	return ok
}

// ErrorDetail returns the first detail of type M in err's gRPC status. It
// looks through wrapped errors.
func ErrorDetail[M protoadapt.MessageV2](err error) (M, bool) {
	var zero M
	if err == nil {
		return zero, false
	}
	st, ok := status.FromError(err)
	if !ok {
		return zero, false
	}
	for _, d := range st.Details() {
		if m, ok := d.(M); ok {
			return m, true
		}
	}
	return zero, false
}

// NewPluginNotFoundError returns a NotFound error with the PluginNotFound
// and Retryable details. node names the agent that looked, and may be empty.
func NewPluginNotFoundError(pluginID, node string) error {
	msg := fmt.Sprintf("plugin %q is not registered", pluginID)
	if node != "" {
		msg = fmt.Sprintf("plugin %q is not registered on node %q", pluginID, node)
	}
	return withDetails(codes.NotFound, msg,
		&PluginNotFound{PluginId: pluginID, Node: node},
		&Retryable{Reason: "the plugin may run on another node"})
}

// NewPluginNotKnownError returns the NotFound error of a cluster request
// for a plugin that no node has registered (yet), with a PluginNotFound
// detail without node.
func NewPluginNotKnownError(pluginID string) error {
	msg := fmt.Sprintf("plugin %q is not known to the cluster: no node has registered it", pluginID)
	return withDetails(codes.NotFound, msg, &PluginNotFound{PluginId: pluginID})
}

// NewPluginUnhealthyError returns an Unavailable error with the
// PluginUnhealthy and Retryable details.
func NewPluginUnhealthyError(pluginID, state, description string) error {
	msg := fmt.Sprintf("plugin %q is %s", pluginID, state)
	if description != "" {
		msg += ": " + description
	}
	return withDetails(codes.Unavailable, msg,
		&PluginUnhealthy{PluginId: pluginID, HealthState: state, HealthDescription: description},
		&Retryable{Reason: "another instance of the plugin may be healthy, or this one may recover"})
}

// NewCapabilityMissingError returns a FailedPrecondition error with the
// CapabilityMissing detail. It is not retryable.
func NewCapabilityMissingError(pluginID, method, capability string) error {
	msg := fmt.Sprintf("plugin %q does not advertise the %s capability that %s needs", pluginID, capability, method)
	return withDetails(codes.FailedPrecondition, msg,
		&CapabilityMissing{PluginId: pluginID, Method: method, Capability: capability})
}

// NewTopologyUnsatisfiableError returns the FailedPrecondition error with
// the TopologyUnsatisfiable detail: no controller of the plugin can make
// the volume where requisite (segments as "k=v,k=v") asks, for the given
// reason. It is not retryable as it stands.
func NewTopologyUnsatisfiableError(pluginID string, requisite []string, reason string) error {
	msg := fmt.Sprintf("plugin %q: topology requirement [%s] cannot be met: %s", pluginID, strings.Join(requisite, " | "), reason)
	return withDetails(codes.FailedPrecondition, msg,
		&TopologyUnsatisfiable{PluginId: pluginID, Requisite: requisite, Reason: reason})
}

// NewNodeCapabilityMissingError returns a FailedPrecondition error with the
// CapabilityMissing detail for a node capability that the plugin's
// instance on node lacks. It is not retryable: the plugin on that node
// must change first.
func NewNodeCapabilityMissingError(pluginID, node, method, capability string) error {
	msg := fmt.Sprintf("plugin %q on node %q does not advertise the %s node capability that %s needs", pluginID, node, capability, method)
	return withDetails(codes.FailedPrecondition, msg,
		&CapabilityMissing{PluginId: pluginID, Method: method, Capability: capability, Node: node})
}

// Rules a claim can break, as ClaimRefused.rule names them.
const (
	ClaimRuleAccessMode   = "access-mode"
	ClaimRuleCapability   = "capability"
	ClaimRuleTopology     = "topology"
	ClaimRuleMaxVolumes   = "max-volumes"
	ClaimRuleNodeNotReady = "node-not-ready"
	ClaimRulePlugin       = "plugin-missing"
	ClaimRuleReleasing    = "releasing"
	// ClaimRuleStale refuses a claim change computed from a state that
	// has changed since: another leader, or another step, changed the
	// claim or its volume first. Read the volume again to learn its state.
	ClaimRuleStale = "stale"
	// ClaimRuleInvalid refuses a claim whose usage is not allowed: mount
	// flags or a file system type that may not reach a plugin.
	ClaimRuleInvalid = "invalid-usage"
	// ClaimRuleAvailability refuses a new claim of a volume an operator
	// paused or drains (`volume availability`), or of a plugin an
	// operator drains on the claim's node (`plugin drain`).
	ClaimRuleAvailability = "availability"
)

// NewClaimRefusedError returns the FailedPrecondition error that refuses a
// volume claim, with the ClaimRefused detail naming the rule it broke.
func NewClaimRefusedError(rule, description string) error {
	return withDetails(codes.FailedPrecondition, claimRefusedMessage(rule, description), &ClaimRefused{Rule: rule, Description: description})
}

// NewClaimDeferredError returns the Unavailable error that refuses a
// volume claim for now: the ClaimRefused detail names the rule, and the
// Retryable detail says what will admit the claim (retry) without the
// caller changing anything.
func NewClaimDeferredError(rule, description, retry string) error {
	return withDetails(codes.Unavailable, claimRefusedMessage(rule, description),
		&ClaimRefused{Rule: rule, Description: description}, &Retryable{Reason: retry})
}

func claimRefusedMessage(rule, description string) string {
	return fmt.Sprintf("claim refused (%s): %s", rule, description)
}

// IsNoLeader reports whether err carries a NoLeader detail: the server
// that answered knows no leader that can serve the request.
func IsNoLeader(err error) bool {
	_, ok := ErrorDetail[*NoLeader](err)
	return ok
}

// NewNoLeaderError returns the Unavailable error of a request that needs
// the leader when server knows of none that can serve it, with the
// NoLeader detail. It is retryable. server may be empty when the error is
// made where the server's id is not known.
func NewNoLeaderError(server, reason string) error {
	msg := fmt.Sprintf("server %s: no cluster leader (%s)", server, reason)
	if server == "" {
		msg = fmt.Sprintf("no cluster leader (%s)", reason)
	}
	return withDetails(codes.Unavailable, msg, &NoLeader{Server: server, Reason: reason}, &Retryable{Reason: reason})
}

// NewNodeUnreachableError returns the Unavailable error of work on node
// nodeID that failed because its agent at addr could not be reached; err
// is the failed call's error. It carries the NodeUnreachable and Retryable
// details.
func NewNodeUnreachableError(nodeID, addr string, err error) error {
	reason := status.Convert(err).Message()
	msg := fmt.Sprintf("node %q: its agent at %s cannot be reached: %s", nodeID, addr, reason)
	return withDetails(codes.Unavailable, msg,
		&NodeUnreachable{NodeId: nodeID, Address: addr, Reason: reason},
		&Retryable{Reason: "the node's agent may come back"})
}

// NewEventsFellBehindError returns the ResourceExhausted error that ends an
// event stream whose reader is lag batches behind the newest event, more
// than maxLag, with the EventsFellBehind detail naming where to resume.
func NewEventsFellBehindError(resumeIndex, lag, maxLag uint64) error {
	msg := fmt.Sprintf("fell behind: %d events behind the newest (at most %d); resume from index %d", lag, maxLag, resumeIndex)
	return withDetails(codes.ResourceExhausted, msg,
		&EventsFellBehind{ResumeIndex: resumeIndex, Lag: lag, MaxLag: maxLag})
}

// NewEventsGoneError returns the OutOfRange error of an event stream that
// was to continue after index after, when the oldest event still buffered
// is oldest: the events in between are lost to it.
func NewEventsGoneError(after, oldest uint64) error {
	msg := fmt.Sprintf("events after index %d are no longer buffered (the oldest is %d): read the state again, then follow the newest events", after, oldest)
	return withDetails(codes.OutOfRange, msg, &EventsGone{After: after, OldestIndex: oldest})
}

// MarkIgnorable returns err with an Ignorable detail appended to its gRPC
// status; code, message and the other details are kept. A nil err stays nil.
func MarkIgnorable(err error, reason string) error {
	return appendDetail(err, &Ignorable{Reason: reason})
}

// MarkRetryable returns err with a Retryable detail appended to its gRPC
// status; code, message and the other details are kept. A nil err stays nil.
func MarkRetryable(err error, reason string) error {
	return appendDetail(err, &Retryable{Reason: reason})
}

func appendDetail(err error, d protoadapt.MessageV1) error {
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	withD, derr := st.WithDetails(d)
	if derr != nil {
		// Only an OK status refuses details, and err is not nil.
		return err
	}
	return withD.Err()
}

func withDetails(c codes.Code, msg string, details ...protoadapt.MessageV1) error {
	st, err := status.New(c, msg).WithDetails(details...)
	if err != nil {
		// WithDetails fails only for codes.OK, which is never used here.
		return status.Error(c, msg)
	}
	return st.Err()
}
