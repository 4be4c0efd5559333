package csiclient

import (
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
)

// rawMsg is a marshalled protobuf message. Invoke gets its request and
// reply as proto.Message values of any type, while a connect.Client is
// typed; carrying bytes lets one client type serve every method, and
// Invoke marshals and unmarshals itself.
type rawMsg struct{ b []byte }

// rawCodec passes rawMsg bytes through. It is named "proto" so that the
// content-type is plain application/grpc and connect uses it for the
// google.rpc.Status in grpc-status-details-bin too, which is why it also
// handles proto.Message values.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	return rawCodec{}.MarshalAppend(nil, v)
}

// MarshalAppend lets connect copy the request into its pooled buffer
// rather than keep (and later reuse) the caller's slice.
func (rawCodec) MarshalAppend(dst []byte, v any) ([]byte, error) {
	switch m := v.(type) {
	case *rawMsg:
		return append(dst, m.b...), nil
	case proto.Message:
		return proto.MarshalOptions{}.MarshalAppend(dst, m)
	}
	return nil, fmt.Errorf("csiclient: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	switch m := v.(type) {
	case *rawMsg:
		// data is connect's pooled buffer, reused after this returns.
		m.b = append(m.b[:0], data...)
		return nil
	case proto.Message:
		return proto.Unmarshal(data, m)
	}
	return fmt.Errorf("csiclient: cannot unmarshal into %T", v)
}

// clientKey identifies a connect client: one per method and reply cap.
type clientKey struct {
	method    string
	recvLimit int
}

// maxCachedClients bounds the connect client cache. CSI has a few dozen
// methods and a process one or two caps; beyond the bound (a caller
// passing ever new MaxCallRecvMsgSize values) a call gets its own client.
const maxCachedClients = 256

// connectClient returns the Transport's gRPC client for method with reply
// cap recvLimit; callRouter sends each request on its own call's
// connection.
func (t *Transport) connectClient(method string, recvLimit int) *connect.Client[rawMsg, rawMsg] {
	k := clientKey{method, recvLimit}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.clients[k]; ok {
		return c
	}
	// The authority is only a name here: callRouter picks the connection.
	c := connect.NewClient[rawMsg, rawMsg](callRouter{}, "http://localhost"+method,
		connect.WithGRPC(),
		connect.WithCodec(rawCodec{}),
		connect.WithReadMaxBytes(recvLimit),
		// connect accepts gzip by default; a plugin must not compress
		// what we never offered to decompress.
		connect.WithAcceptCompression("gzip", nil, nil),
	)
	if len(t.clients) < maxCachedClients {
		t.clients[k] = c
	}
	return c
}
