package rpc

import (
	"errors"
	"fmt"
	"slices"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// GRPCMetrics count the requests of the agent's gRPC server (every API:
// Agent, ClientCSI, NodeVolumes, Control and the cluster-internal
// services) and of its gRPC clients (calls into plugins, to servers and
// to other agents), by service, method and code, with latency
// histograms: grpc_server_* and grpc_client_* of
// go-grpc-middleware's Prometheus provider. A nil *GRPCMetrics adds
// nothing.
type GRPCMetrics struct {
	server *grpcprom.ServerMetrics
	client *grpcprom.ClientMetrics
}

// NewGRPCMetrics creates the collectors, with latency histograms of
// buckets (in seconds: config.LatencyBuckets), and registers them in reg.
func NewGRPCMetrics(reg prometheus.Registerer, buckets []float64) (*GRPCMetrics, error) {
	if reg == nil {
		return nil, errors.New("rpc: gRPC metrics need a Registerer")
	}
	if len(buckets) == 0 {
		return nil, errors.New("rpc: gRPC metrics need latency buckets")
	}
	m := &GRPCMetrics{
		server: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(slices.Clone(buckets)))),
		client: grpcprom.NewClientMetrics(grpcprom.WithClientHandlingTimeHistogram(grpcprom.WithHistogramBuckets(slices.Clone(buckets)))),
	}
	if err := errors.Join(reg.Register(m.server), reg.Register(m.client)); err != nil {
		return nil, fmt.Errorf("rpc: gRPC metrics: %w", err)
	}
	return m, nil
}

// ServerOptions measure every call of a server. They go before the
// authorization interceptors, so refused calls are counted with their
// code.
func (m *GRPCMetrics) ServerOptions() []grpc.ServerOption {
	if m == nil {
		return nil
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.server.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(m.server.StreamServerInterceptor()),
	}
}

// DialOptions measure every call made on a client connection.
func (m *GRPCMetrics) DialOptions() []grpc.DialOption {
	if m == nil {
		return nil
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(m.client.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(m.client.StreamClientInterceptor()),
	}
}

// UnaryClientInterceptor measures the unary calls of a client whose
// connection is not dialled with DialOptions (a plugin's shared
// connection). Nil on a nil *GRPCMetrics.
func (m *GRPCMetrics) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	if m == nil {
		return nil
	}
	return m.client.UnaryClientInterceptor()
}
