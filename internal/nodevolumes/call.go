package nodevolumes

import (
	"context"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
)

// resolve finds the plugin and checks that it has a node service and
// capability (when not empty). Its errors carry the typed details of the
// api package.
func (m *Manager) resolve(pluginID, method, capability string) (*csisupdv1.Plugin, error) {
	p, _, err := m.calls.Resolve(csiclient.NodeService, csiclient.Call{PluginID: pluginID, Method: method, Capability: capability})
	return p, err
}

// call makes one node service call, csiMethod, for method (a NodeVolumes
// method) through the node's one plugin call path (csiclient.Invoke),
// with the retries of ClientCSI. A context without a deadline gets the
// default one. Errors keep their code and details; secret values of req
// are removed from their message.
func call[Req proto.Message, Resp any](
	ctx context.Context, m *Manager, pluginID, method, csiMethod string, req Req,
	rpc func(csi.NodeClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	c := csiclient.Call{PluginID: pluginID, Method: method, CSIMethod: csiMethod, Timeout: m.timeout}
	return csiclient.Invoke(ctx, m.calls, csiclient.NodeService, c, req, func(ctx context.Context, cl *csiclient.Client) (Resp, error) {
		return rpc(cl.Node, ctx, req)
	})
}
