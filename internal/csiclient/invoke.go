package csiclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
)

// MaxAttempts is how many times one call is made to a plugin at most: the
// first attempt and up to two retries, spaced by InvokerConfig.Retry.
const MaxAttempts = 3

// healthUnknown is the health state (heartbeat.Unknown, a package above
// this one) reported for a plugin that is not fingerprinted yet.
const healthUnknown = "unknown"

// PluginLookup finds a plugin on this node. The registry's Manager
// implements it.
type PluginLookup interface {
	// Lookup returns plugin id's read model and the supervisor's live
	// connection to the instance that read model describes; the
	// connection is nil while no such connection exists (the instance is
	// not fingerprinted yet, or not supervised). ok is false when no
	// plugin has the id.
	Lookup(id string) (p *csisupdv1.Plugin, conn *Client, ok bool)
}

// Service is the CSI service a call needs of a plugin.
type Service int

// The services calls go to.
const (
	// ControllerService: the plugin advertises CONTROLLER_SERVICE.
	ControllerService Service = iota + 1
	// NodeService: the plugin is a node or a monolith.
	NodeService
)

// InvokerConfig configures an Invoker.
type InvokerConfig struct {
	// Plugins finds plugins by id. Required.
	Plugins PluginLookup
	// NodeName names this node in PluginNotFound errors. Optional.
	NodeName string
	// Retry spaces the attempts of one call, each call with a backoff of
	// its own (jittered, so calls that failed together do not retry
	// together). Required; the agent's is its ClientCSI retry policy.
	Retry retry.Policy
	// Logger receives one debug line per call, and at trace level the
	// request with its secrets redacted. Optional.
	Logger hclog.Logger
	// Secrets, when set, adds the node's secrets of the plugin called to
	// each request (under the secrets the request carries), so that every
	// call of this node, whoever asked for it, has what the plugin needs.
	// Optional.
	Secrets SecretSource
}

// SecretSource adds a plugin's secrets to a CSI request. The agent's is a
// secrets.Store over its plugins' secrets files.
type SecretSource interface {
	// Apply merges pluginID's secrets into req; requests without a
	// secrets field are left alone.
	Apply(pluginID string, req proto.Message)
}

// Invoker makes the calls of ClientCSI and of the node volume manager to
// the plugins of this node, one way for both: it finds the plugin and
// checks that it can serve the call, applies a default deadline, retries
// retryable failures while the deadline leaves room, and keeps the
// request's secrets out of errors and logs. It is safe for concurrent
// use.
type Invoker struct {
	plugins PluginLookup
	node    string
	retry   retry.Policy
	log     hclog.Logger
	secrets SecretSource
}

// NewInvoker validates cfg and returns an Invoker.
func NewInvoker(cfg InvokerConfig) (*Invoker, error) {
	var errs []error
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("csiclient: InvokerConfig.Plugins is required"))
	}
	if err := cfg.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("csiclient: InvokerConfig.Retry: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Invoker{plugins: cfg.Plugins, node: cfg.NodeName, retry: cfg.Retry, log: cfg.Logger, secrets: cfg.Secrets}, nil
}

// Policy returns the retry policy that spaces the attempts of a call.
func (inv *Invoker) Policy() retry.Policy { return inv.retry }

// Call describes one call to a plugin.
type Call struct {
	// PluginID is the plugin called.
	PluginID string
	// Method is the API method making the call (a ClientCSI or NodeVolumes
	// method): CapabilityMissing errors and logs name it.
	Method string
	// CSIMethod is the plugin's method called, for logs.
	CSIMethod string
	// Capability, when set, is the controller or node capability the call
	// needs besides its service.
	Capability string
	// Timeout is the deadline of a call whose context has none.
	Timeout time.Duration
	// Slot, when set, is taken before each attempt and released after it;
	// an error from it ends the call with that error. ClientCSI's
	// destructive calls hold one of their plugin's slots this way.
	Slot func(ctx context.Context) (release func(), err error)
}

// Resolve finds the plugin of c and checks that it can serve c: it exists,
// is healthy and fingerprinted, and has svc and c.Capability. It returns
// the plugin's read model and connection; its errors carry the typed
// details of the api package and never a request body.
func (inv *Invoker) Resolve(svc Service, c Call) (*csisupdv1.Plugin, *Client, error) {
	if c.PluginID == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "plugin_id is required")
	}
	p, client, ok := inv.plugins.Lookup(c.PluginID)
	if !ok {
		return nil, nil, csisupdv1.NewPluginNotFoundError(c.PluginID, inv.node)
	}
	if !p.GetHealthy() {
		return nil, nil, csisupdv1.NewPluginUnhealthyError(c.PluginID, p.GetHealthState(), p.GetHealthDescription())
	}
	if client == nil {
		// Healthy, but its capabilities are not known yet, or they are
		// another instance's (Lookup pairs a connection only with its own
		// instance's record).
		return nil, nil, csisupdv1.NewPluginUnhealthyError(c.PluginID, healthUnknown, "not fingerprinted yet")
	}
	var caps []string
	switch svc {
	case ControllerService:
		if !slices.Contains(p.GetPluginCapabilities(), plugin.CapControllerService) {
			return nil, nil, csisupdv1.NewCapabilityMissingError(c.PluginID, c.Method, plugin.CapControllerService)
		}
		caps = p.GetControllerCapabilities()
	case NodeService:
		if _, node := plugin.Type(p.GetType()).Roles(); !node {
			return nil, nil, csisupdv1.NewCapabilityMissingError(c.PluginID, c.Method, plugin.CapNodeService)
		}
		caps = p.GetNodeCapabilities()
	default:
		return nil, nil, status.Errorf(codes.Internal, "csiclient: call %s needs service %d, which is none", c.Method, svc)
	}
	if c.Capability != "" && !slices.Contains(caps, c.Capability) {
		return nil, nil, csisupdv1.NewCapabilityMissingError(c.PluginID, c.Method, c.Capability)
	}
	return p, client, nil
}

// Invoke makes one call of svc to c's plugin with req: do sends req on
// the connection it is given, for example
//
//	func(ctx context.Context, cl *csiclient.Client) (*csi.CreateVolumeResponse, error) {
//		return cl.Controller.CreateVolume(ctx, req)
//	}
//
// It finds the plugin (Resolve) before the first attempt and again before
// each retry, since the plugin may have been replaced or found unhealthy
// meanwhile. A context without a deadline gets c.Timeout. An attempt that
// fails with a RetryableCode is repeated, up to MaxAttempts attempts,
// after the policy's backoff, when the deadline leaves room for the wait
// and another attempt. The error returned keeps the plugin's code and
// details, with every secret value of req removed from its message
// (RedactError); an ended context gives DeadlineExceeded or Canceled.
func Invoke[Resp any](ctx context.Context, inv *Invoker, svc Service, c Call, req proto.Message,
	do func(context.Context, *Client) (Resp, error),
) (Resp, error) {
	var zero Resp
	start := time.Now()
	if inv.secrets != nil {
		// Before the log line and the first attempt: errors and logs
		// redact what req holds, the node's secrets included.
		inv.secrets.Apply(c.PluginID, req)
	}
	if inv.log.IsTrace() {
		inv.log.Trace("call", c.logArgs("request", redactedJSON(req))...)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	var backoff *retry.BackOff // made at the first retry: most calls need none
	for attempt := 1; ; attempt++ {
		_, client, err := inv.Resolve(svc, c)
		if err != nil {
			if inv.log.IsDebug() {
				inv.log.Debug("call refused", c.logArgs("attempt", attempt, "code", status.Code(err), "error", err)...)
			}
			return zero, err
		}
		var release func()
		if c.Slot != nil {
			if release, err = c.Slot(ctx); err != nil {
				if inv.log.IsDebug() {
					inv.log.Debug("call ended while waiting for a slot", c.logArgs("attempt", attempt, "code", status.Code(err))...)
				}
				return zero, err
			}
		}
		resp, err := do(ctx, client)
		if release != nil {
			release()
		}
		if err == nil {
			if inv.log.IsDebug() {
				inv.log.Debug("call", c.logArgs("code", codes.OK, "attempts", attempt, "duration", time.Since(start))...)
			}
			return resp, nil
		}
		err = RedactError(err, req)
		code := status.Code(err)
		if attempt < MaxAttempts && RetryableCode(code) {
			if backoff == nil {
				backoff = inv.retry.NewBackOff()
			}
			if delay := backoff.NextBackOff(); deadlineAllows(ctx, delay) {
				if inv.log.IsDebug() {
					inv.log.Debug("attempt failed; retrying", c.logArgs("code", code, "attempt", attempt, "backoff", delay,
						"error", status.Convert(err).Message())...)
				}
				if retry.Wait(ctx, delay) != nil {
					return zero, ContextError(ctx)
				}
				continue
			}
		}
		if inv.log.IsDebug() {
			inv.log.Debug("call", c.logArgs("code", code, "attempts", attempt, "duration", time.Since(start),
				"error", status.Convert(err).Message())...)
		}
		return zero, err
	}
}

// logArgs returns the log fields that name c, followed by kv.
func (c Call) logArgs(kv ...any) []any {
	return append([]any{"method", c.Method, "csi_method", c.CSIMethod, "plugin", c.PluginID}, kv...)
}

// RetryableCode reports whether a plugin call that failed with c may be
// repeated: the plugin was unreachable, overloaded, or ran out of time on
// its own.
func RetryableCode(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// ContextError turns the error of ctx, which has ended, into a gRPC status
// error: DeadlineExceeded or Canceled.
func ContextError(ctx context.Context) error {
	return contextStatus(ctx.Err())
}

// deadlineAllows reports whether ctx leaves time for a wait of d and
// another attempt.
func deadlineAllows(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > d
}
