package kubeletreg

import (
	"context"
	"fmt"
	"path/filepath"
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

// call runs f on a fresh connection to socket and closes it. One
// connection per call keeps nothing open to a registrar between the rare
// calls kubelet's protocol makes.
func call(ctx context.Context, socket string, f func(context.Context, registerapi.RegistrationClient) error) error {
	abs, err := filepath.Abs(socket)
	if err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %q: %w", socket, err)
	}
	if err := csiclient.CheckSocketPath(abs); err != nil {
		return fmt.Errorf("kubeletreg: registrar socket: %w", err)
	}
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithMaxHeaderListSize(maxHeaderListSize),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxReplySize)))
	if err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w", abs, err)
	}
	defer conn.Close()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	if err := f(ctx, registerapi.NewRegistrationClient(conn)); err != nil {
		return fmt.Errorf("kubeletreg: registrar socket %s: %w", abs, err)
	}
	return nil
}
