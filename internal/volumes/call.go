package volumes

import (
	"context"
	"slices"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/rpc"
)

// maxAttempts is how many times one plugin call is made at most, as in
// ClientCSI.
const maxAttempts = rpc.MaxAttempts

// resolveClient finds the plugin and its connection, and checks that it
// can serve method: healthy, fingerprinted, with a node service and
// capability (when not empty).
func (m *Manager) resolveClient(pluginID, method, capability string) (*csisupdv1.Plugin, *csiclient.Client, error) {
	p, client, ok := m.plugins.Lookup(pluginID)
	if !ok {
		return nil, nil, csisupdv1.NewPluginNotFoundError(pluginID, m.node)
	}
	if !p.GetHealthy() {
		return nil, nil, csisupdv1.NewPluginUnhealthyError(pluginID, p.GetHealthState(), p.GetHealthDescription())
	}
	if client == nil {
		return nil, nil, csisupdv1.NewPluginUnhealthyError(pluginID, healthUnknown, "not fingerprinted yet")
	}
	if t := p.GetType(); t != typeNode && t != typeMonolith {
		return nil, nil, csisupdv1.NewCapabilityMissingError(pluginID, method, capNodeService)
	}
	if capability != "" && !slices.Contains(p.GetNodeCapabilities(), capability) {
		return nil, nil, csisupdv1.NewCapabilityMissingError(pluginID, method, capability)
	}
	return p, client, nil
}

// call makes one node service call for method (a NodeVolumes method) with
// the retries of ClientCSI: up to maxAttempts attempts while the plugin
// fails with a retryable code and the deadline leaves room, the plugin
// found again before each. A context without a deadline gets the default
// one. Errors keep their code and details; secret values of req are
// removed from their message.
func call[Req proto.Message, Resp any](
	ctx context.Context, m *Manager, pluginID, method, csiMethod string, req Req,
	rpcFn func(csi.NodeClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	var zero Resp
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	start := time.Now()
	var backoff *retry.BackOff
	for attempt := 1; ; attempt++ {
		_, client, err := m.resolveClient(pluginID, method, "")
		if err != nil {
			m.log.Debug("call refused", "method", csiMethod, "plugin", pluginID, "attempt", attempt, "code", status.Code(err))
			return zero, err
		}
		resp, err := rpcFn(client.Node, ctx, req)
		if err == nil {
			m.log.Debug("call", "method", csiMethod, "plugin", pluginID, "code", codes.OK, "attempts", attempt, "duration", time.Since(start))
			return resp, nil
		}
		code := status.Code(err)
		if attempt < maxAttempts && rpc.RetryableCode(code) {
			if backoff == nil {
				backoff = m.retry.NewBackOff()
			}
			if delay := backoff.NextBackOff(); deadlineAllows(ctx, delay) {
				m.log.Debug("attempt failed; retrying", "method", csiMethod, "plugin", pluginID, "code", code,
					"attempt", attempt, "backoff", delay, "error", rpc.RedactString(statusMessage(err), req))
				if retry.Wait(ctx, delay) != nil {
					return zero, contextError(ctx)
				}
				continue
			}
		}
		err = redactError(err, req)
		m.log.Debug("call", "method", csiMethod, "plugin", pluginID, "code", code, "attempts", attempt,
			"duration", time.Since(start), "error", statusMessage(err))
		return zero, err
	}
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

// redactError returns err with every secret value of req removed from its
// message; code and details are kept. An error that is not a gRPC status
// becomes Unknown with the redacted text.
func redactError(err error, req proto.Message) error {
	st, ok := status.FromError(err)
	if !ok {
		return status.Error(codes.Unknown, rpc.RedactString(err.Error(), req))
	}
	msg := rpc.RedactString(st.Message(), req)
	if msg == st.Message() {
		return err
	}
	p := st.Proto()
	p.Message = msg
	return status.FromProto(p).Err()
}
