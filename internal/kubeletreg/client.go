package kubeletreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csisupd/csisupd/internal/csiclient"
)

// MaxReplySize caps, in bytes, a registrar's reply. A genuine GetInfo
// answer is a few hundred bytes; the cap keeps a hostile one from making
// us allocate.
const MaxReplySize = 64 << 10

// maxHeaderListSize caps the headers and trailers a registrar may send,
// its error messages among them, for the same reason.
const maxHeaderListSize = 16 << 10

// DefaultTimeout bounds a call whose context has no deadline: a registrar
// that never answers must not hold the caller forever.
const DefaultTimeout = 10 * time.Second

// Info is a registrar's answer to GetInfo.
type Info struct {
	// Type is the plugin type; csisupd supervises registerapi.CSIPlugin.
	Type string
	// Name is the driver name, which csisupd uses as the plugin id.
	Name string
	// Endpoint is the driver's CSI socket, a path or a unix:// URL.
	Endpoint string
	// SupportedVersions are the CSI versions the driver says it speaks.
	SupportedVersions []string
}

// GetInfo asks the registrar serving socket who it is. The call is bounded
// by ctx and its reply by MaxReplySize; the connection is closed before
// GetInfo returns.
func GetInfo(ctx context.Context, socket string) (Info, error) {
	var info Info
	err := call(ctx, socket, func(ctx context.Context, c registerapi.RegistrationClient) error {
		reply, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
		if err != nil {
			return fmt.Errorf("GetInfo: %w", err)
		}
		info = Info{
			Type:              reply.GetType(),
			Name:              reply.GetName(),
			Endpoint:          reply.GetEndpoint(),
			SupportedVersions: reply.GetSupportedVersions(),
		}
		return nil
	})
	return info, err
}

// Notify tells the registrar serving socket whether its plugin was
// registered and, if not, why (reason). A registrar told false is
// expected to exit. Bounds as for GetInfo.
func Notify(ctx context.Context, socket string, registered bool, reason string) error {
	return call(ctx, socket, func(ctx context.Context, c registerapi.RegistrationClient) error {
		_, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason})
		if err != nil {
			return fmt.Errorf("NotifyRegistrationStatus(registered=%t): %w", registered, err)
		}
		return nil
	})
}

// ErrNotListening is wrapped by the error of a call whose registrar
// socket refused the connection: the file is there but nobody listens on
// it (yet: a registrar binds its socket a moment before it listens). Any
// other failure, a registrar that accepts and then answers garbage or
// nothing, is not one, so that a caller retries at once only what a
// moment can fix.
var ErrNotListening = errors.New("registrar socket refuses connections")

// call runs f on a fresh connection to socket and closes it. One
// connection per call keeps nothing open to a registrar between the rare
// calls kubelet's protocol makes. The connection is dialled here, once,
// before gRPC sees it: a refused dial fails the call at once with
// ErrNotListening, and gRPC never redials the socket on its own.
func call(ctx context.Context, socket string, f func(context.Context, registerapi.RegistrationClient) error) error {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %q: %w", socket, err)
	}
	if err := csiclient.CheckSocketPath(abs); err != nil {
		return fmt.Errorf("kubeletreg: registrar socket: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "unix", abs)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w: %w", abs, ErrNotListening, err)
	}
	if err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w", abs, err)
	}
	dial, unused := onceDialer(raw)
	defer unused()
	conn, err := grpc.NewClient("passthrough:///"+abs,
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithMaxHeaderListSize(maxHeaderListSize),
		// A registrar's call moves a few hundred bytes: gRPC's default
		// 32 KiB read and write buffers per connection would be most of
		// what a call allocates, and a node may ask hundreds of broken
		// registrars again and again.
		grpc.WithReadBufferSize(0),
		grpc.WithWriteBufferSize(0),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxReplySize)))
	if err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w", abs, err)
	}
	defer conn.Close()
	if err := f(ctx, registerapi.NewRegistrationClient(conn)); err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w", abs, err)
	}
	return nil
}

// errConnectionUsed fails gRPC's redials of a call's connection: a call
// makes one connection, and a registrar that drops it has answered.
var errConnectionUsed = errors.New("the call's one connection was used already")

// onceDialer hands gRPC the connection c at its first dial, and fails
// every later one; unused closes c if gRPC never took it.
func onceDialer(c net.Conn) (dial func(context.Context, string) (net.Conn, error), unused func()) {
	ch := make(chan net.Conn, 1)
	ch <- c
	take := func() (net.Conn, bool) {
		select {
		case c := <-ch:
			return c, true
		default:
			return nil, false
		}
	}
	dial = func(context.Context, string) (net.Conn, error) {
		if c, ok := take(); ok {
			return c, nil
		}
		return nil, errConnectionUsed
	}
	unused = func() {
		if c, ok := take(); ok {
			_ = c.Close()
		}
	}
	return dial, unused
}
