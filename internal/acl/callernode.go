package acl

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/metadata"
)

// CallerNodeMetadataKey is the gRPC metadata key a server forwarding a call
// puts the caller's node bindings in, one value per binding:
// "token=node-1", "certificate=node-1".
const CallerNodeMetadataKey = "csisupd-caller-node"

// The sources of a node binding: the credential that binds the caller.
const (
	// BindingToken is a token made with a node identity (acl token create
	// --node-identity).
	BindingToken = "token"
	// BindingCertificate is a client certificate that names its node (tls
	// cert create --client --node), trusted when tls.verify_node_name is
	// on.
	BindingCertificate = "certificate"
)

// Caps of the bindings read from incoming metadata: a peer can send
// anything there. Beyond them, or for a value that is not a binding, the
// caller is bound to nothing it could act as (see CallerNodeFromIncoming).
const (
	maxForwardedBindings = 8
	maxForwardedValue    = 512
)

// bindingMalformed is the source of a binding made of metadata that could
// not be read: it allows acting as no node at all.
const bindingMalformed = "malformed"

// binding is one credential that binds a caller to a node name.
type binding struct {
	source, name string
}

// CallerNode is what a caller's credentials bind it to: the node names its
// token (acl token create --node-identity) and its certificate (tls cert
// create --client --node, when tls.verify_node_name is on) allow it to act
// as. The zero value binds nothing. A CallerNode is a value: its methods
// return new ones and never change the receiver.
//
// Bindings only narrow: Check passes only a name every binding allows, so
// adding a binding from any source, however little trusted, can never let
// a caller act as a node it could not act as before.
type CallerNode struct {
	bindings []binding
}

// BindToken returns c with one more binding: the caller's token is bound
// to node name.
func (c CallerNode) BindToken(name string) CallerNode { return c.with(binding{BindingToken, name}) }

// BindCertificate returns c with one more binding: the caller's
// certificate names node name.
func (c CallerNode) BindCertificate(name string) CallerNode {
	return c.with(binding{BindingCertificate, name})
}

// with returns a copy of c with b added, unless c has it already.
func (c CallerNode) with(b binding) CallerNode {
	if slices.Contains(c.bindings, b) {
		return c
	}
	return CallerNode{bindings: append(slices.Clip(c.bindings), b)}
}

// Bound reports whether any credential binds the caller to a node.
func (c CallerNode) Bound() bool { return len(c.bindings) > 0 }

// Check returns nil when every binding allows acting as node name (and
// always for an unbound caller), else an error that names the first
// credential that does not and its node (or the forwarded binding that
// could not be read), for example
// `the token is bound to node "node-1", not "node-2"`.
func (c CallerNode) Check(name string) error {
	for _, b := range c.bindings {
		if b.source == bindingMalformed {
			return fmt.Errorf("the forwarded caller binding %q (metadata %s) cannot be read, so the caller may act as no node", b.name, CallerNodeMetadataKey)
		}
	}
	for _, b := range c.bindings {
		if b.name != name {
			return fmt.Errorf("the %s is bound to node %q, not %q", b.source, b.name, name)
		}
	}
	return nil
}

// Merge returns the bindings of both c and o. A merge can only narrow
// what the caller may do.
func (c CallerNode) Merge(o CallerNode) CallerNode {
	for _, b := range o.bindings {
		c = c.with(b)
	}
	return c
}

// String lists the bindings as they travel in metadata, joined by ",";
// "unbound" when there are none. For logs: it holds no secret.
func (c CallerNode) String() string {
	if !c.Bound() {
		return "unbound"
	}
	return strings.Join(c.values(), ",")
}

// values returns the metadata values of the bindings.
func (c CallerNode) values() []string {
	out := make([]string, len(c.bindings))
	for i, b := range c.bindings {
		out[i] = b.source + "=" + b.name
	}
	return out
}

// callerNodeKey is the context key of a CallerNode.
type callerNodeKey struct{}

// WithCallerNode returns ctx carrying c, for the handler of a call.
func WithCallerNode(ctx context.Context, c CallerNode) context.Context {
	return context.WithValue(ctx, callerNodeKey{}, c)
}

// CallerNodeFromContext returns the CallerNode WithCallerNode put in ctx;
// the zero CallerNode when there is none.
func CallerNodeFromContext(ctx context.Context) CallerNode {
	c, _ := ctx.Value(callerNodeKey{}).(CallerNode)
	return c
}

// AppendCallerNode adds c's bindings to ctx's outgoing gRPC metadata, under
// CallerNodeMetadataKey: a server forwarding a call to the leader passes
// on what the caller's credentials bind it to. An unbound c leaves ctx as
// it is.
func AppendCallerNode(ctx context.Context, c CallerNode) context.Context {
	if !c.Bound() {
		return ctx
	}
	kv := make([]string, 0, 2*len(c.bindings))
	for _, v := range c.values() {
		kv = append(kv, CallerNodeMetadataKey, v)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// CallerNodeFromIncoming reads the bindings AppendCallerNode sent, from
// ctx's incoming gRPC metadata. Reading them from any peer is safe because
// a binding can only narrow. Values that are not "token=NAME" or
// "certificate=NAME", longer than 512 bytes, or more than 8 of them, fail
// closed: they become a binding that allows no node, so that a caller is
// never widened by what could not be read.
func CallerNodeFromIncoming(ctx context.Context) CallerNode {
	// Only the one key, not the whole metadata: FromIncomingContext
	// copies every header of the call, and this runs on every call.
	vals := metadata.ValueFromIncomingContext(ctx, CallerNodeMetadataKey)
	var c CallerNode
	if len(vals) > maxForwardedBindings {
		return c.with(binding{bindingMalformed, fmt.Sprintf("%d values, at most %d", len(vals), maxForwardedBindings)})
	}
	for _, v := range vals {
		source, name, ok := strings.Cut(v, "=")
		switch {
		case len(v) > maxForwardedValue:
			c = c.with(binding{bindingMalformed, fmt.Sprintf("a value of %d bytes, at most %d", len(v), maxForwardedValue)})
		case !ok || name == "" || (source != BindingToken && source != BindingCertificate):
			c = c.with(binding{bindingMalformed, v})
		default:
			c = c.with(binding{source, name})
		}
	}
	return c
}
