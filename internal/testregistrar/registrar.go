package testregistrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultVersion is the CSI version GetInfo lists when Config.Versions is
// nil: the sidecar's only one.
const DefaultVersion = "1.0.0"

// MaxStatuses caps the NotifyRegistrationStatus calls a Registrar records;
// later ones fail with ResourceExhausted, so a runaway client cannot grow
// the record without bound.
const MaxStatuses = 1024

// maxRequestSize caps a request: a status's reason is short text.
const maxRequestSize = 64 << 10

// stopTimeout bounds Stop's graceful stop; calls still running then are
// cut off.
const stopTimeout = 5 * time.Second

// maxSocketPath is the longest unix socket path (sun_path less its NUL).
const maxSocketPath = 107

// Config describes a registrar.
type Config struct {
	// Dir is the registration directory the socket is created in. Required.
	Dir string
	// Driver is the CSI driver name GetInfo answers; the socket is
	// <Dir>/<Driver>-reg.sock. Required.
	Driver string
	// Endpoint is the driver's CSI socket as GetInfo answers it, the
	// sidecar's --kubelet-registration-path. Sent as given.
	Endpoint string
	// Type is the plugin type GetInfo answers; empty means CSIPlugin.
	Type string
	// Versions are the CSI versions GetInfo answers; nil means
	// [DefaultVersion]. A non-nil empty slice lists none.
	Versions []string
}

// Status is one NotifyRegistrationStatus call received.
type Status struct {
	// Registered is whether the plugin was registered.
	Registered bool
	// Error is the reason it was not.
	Error string
}

// Registrar is a running registration server. Its methods are safe for
// concurrent use.
type Registrar struct {
	registerapi.UnimplementedRegistrationServer

	info   *registerapi.PluginInfo
	socket string
	ours   os.FileInfo // the socket file as created, to remove only that
	srv    *grpc.Server
	served chan struct{} // closed when Serve has returned

	mu       sync.Mutex
	statuses []Status
	changed  chan struct{} // closed and replaced at each new status

	stopOnce sync.Once
}

// Start listens on <cfg.Dir>/<cfg.Driver>-reg.sock, removing a stale file
// there first, and serves in the background until Stop.
func Start(cfg Config) (*Registrar, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("testregistrar: Config.Dir is empty")
	case cfg.Driver == "":
		return nil, errors.New("testregistrar: Config.Driver is empty")
	case strings.ContainsRune(cfg.Driver, '/') || cfg.Driver == "." || cfg.Driver == "..":
		return nil, fmt.Errorf("testregistrar: Config.Driver %q cannot name a socket file", cfg.Driver)
	}
	if cfg.Type == "" {
		cfg.Type = registerapi.CSIPlugin
	}
	if cfg.Versions == nil {
		cfg.Versions = []string{DefaultVersion}
	}
	socket := filepath.Join(cfg.Dir, cfg.Driver+"-reg.sock")
	if len(socket) > maxSocketPath {
		return nil, fmt.Errorf("testregistrar: socket path %q is %d bytes; a unix socket path may have at most %d", socket, len(socket), maxSocketPath)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("testregistrar: remove stale socket: %w", err)
	}
	lis, ours, err := listen(socket)
	if err != nil {
		return nil, fmt.Errorf("testregistrar: %w", err)
	}
	r := &Registrar{
		info: &registerapi.PluginInfo{
			Type:              cfg.Type,
			Name:              cfg.Driver,
			Endpoint:          cfg.Endpoint,
			SupportedVersions: slices.Clone(cfg.Versions),
		},
		socket:  socket,
		ours:    ours,
		srv:     grpc.NewServer(grpc.MaxRecvMsgSize(maxRequestSize)),
		served:  make(chan struct{}),
		changed: make(chan struct{}),
	}
	registerapi.RegisterRegistrationServer(r.srv, r)
	go func() {
		defer close(r.served)
		// Serve returns nil after Stop; any other end is a listener
		// failure, which the test sees as a registrar that stopped
		// answering, as it would with the sidecar.
		_ = r.srv.Serve(lis)
	}()
	return r, nil
}

// listen listens on socket and makes it accessible to its owner only, as
// the sidecar does (with a umask; a chmod right after the bind spares us
// changing the process-wide umask). The listener does not unlink the
// socket when closed: Stop removes it only if it is still ours, so that
// stopping a registrar replaced at the same path leaves its successor's.
func listen(socket string) (net.Listener, os.FileInfo, error) {
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return nil, nil, err
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Lstat(socket)
	if err == nil {
		err = os.Chmod(socket, 0o600)
	}
	if err != nil {
		lis.Close()
		_ = os.Remove(socket)
		return nil, nil, err
	}
	return lis, fi, nil
}

// Socket returns the path the registrar listens on.
func (r *Registrar) Socket() string { return r.socket }

// GetInfo answers the configured plugin info.
func (r *Registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              r.info.Type,
		Name:              r.info.Name,
		Endpoint:          r.info.Endpoint,
		SupportedVersions: slices.Clone(r.info.SupportedVersions),
	}, nil
}

// NotifyRegistrationStatus records the status.
func (r *Registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.statuses) >= MaxStatuses {
		return nil, status.Errorf(codes.ResourceExhausted, "testregistrar: %d statuses recorded already", MaxStatuses)
	}
	r.statuses = append(r.statuses, Status{Registered: s.GetPluginRegistered(), Error: s.GetError()})
	close(r.changed)
	r.changed = make(chan struct{})
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Statuses returns every status received so far, oldest first.
func (r *Registrar) Statuses() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.statuses)
}

// WaitStatus waits until the registrar has received status number n
// (counting from 0: WaitStatus(ctx, 0) waits for the first) and returns
// it, or returns ctx's error when ctx ends first.
func (r *Registrar) WaitStatus(ctx context.Context, n int) (Status, error) {
	if n < 0 || n >= MaxStatuses {
		return Status{}, fmt.Errorf("testregistrar: status number %d is not between 0 and %d", n, MaxStatuses-1)
	}
	for {
		r.mu.Lock()
		if n < len(r.statuses) {
			s := r.statuses[n]
			r.mu.Unlock()
			return s, nil
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Status{}, fmt.Errorf("testregistrar: waiting for status %d on %s: %w", n, r.socket, ctx.Err())
		}
	}
}

// Stop stops serving: gracefully, letting calls in flight finish, for at
// most a few seconds, then by closing every connection. It then removes
// the socket. Stop is idempotent.
func (r *Registrar) Stop() {
	r.stopOnce.Do(func() {
		graceful := make(chan struct{})
		go func() {
			defer close(graceful)
			r.srv.GracefulStop()
		}()
		timer := time.NewTimer(stopTimeout)
		defer timer.Stop()
		select {
		case <-graceful:
		case <-timer.C:
			r.srv.Stop()
			<-graceful
		}
		<-r.served
		if fi, err := os.Lstat(r.socket); err == nil && os.SameFile(fi, r.ours) {
			_ = os.Remove(r.socket)
		}
	})
}
