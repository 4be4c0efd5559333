// Command csi-testregistrar behaves as the node-driver-registrar sidecar
// process does (package testregistrar), for tests that need a registrar
// process: one that exits when registration fails.
//
// Usage:
//
//	csi-testregistrar --registration-dir DIR --driver-name NAME --endpoint PATH [flags]
//
// It serves the kubelet Registration service on DIR/NAME-reg.sock and
// answers GetInfo with NAME, PATH (the sidecar's --kubelet-registration-path),
// --type (default CSIPlugin) and --supported-versions (default 1.0.0; a comma
// list, empty for none). Flags take one or two dashes. It logs to standard
// error.
//
// When told NotifyRegistrationStatus(registered), it prints the line
// "registered" to standard output and keeps serving. When told that
// registration failed, it logs the reason, removes its socket and exits 1,
// so that it can be started again, as the sidecar's container is
// restarted (the sidecar exits without removing its socket). On SIGTERM or
// SIGINT it stops, removes its socket and exits 0. Usage errors exit 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csisupd/csisupd/internal/testregistrar"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // also: registration failed
	exitUsage = 2
)

// registeredLine is printed to standard output at each successful
// registration, so tests can wait for it.
const registeredLine = "registered"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	dir      string
	driver   string
	endpoint string
	typ      string
	versions []string
}

// errUsage marks errors in the command line.
var errUsage = errors.New("usage")

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	var versions string
	fs := flag.NewFlagSet("csi-testregistrar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dir, "registration-dir", "", "kubelet's plugin registration directory, where DRIVER-reg.sock is created")
	fs.StringVar(&o.driver, "driver-name", "", "CSI driver name GetInfo answers")
	fs.StringVar(&o.endpoint, "endpoint", "", "the driver's CSI socket as kubelet sees it (the sidecar's --kubelet-registration-path)")
	fs.StringVar(&o.typ, "type", registerapi.CSIPlugin, "plugin type GetInfo answers")
	fs.StringVar(&versions, "supported-versions", testregistrar.DefaultVersion, "comma-separated CSI versions GetInfo answers; empty for none")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	case o.dir == "":
		return o, fmt.Errorf("%w: --registration-dir is required", errUsage)
	case o.driver == "":
		return o, fmt.Errorf("%w: --driver-name is required", errUsage)
	case o.endpoint == "":
		return o, fmt.Errorf("%w: --endpoint is required, as the sidecar's --kubelet-registration-path is", errUsage)
	}
	o.versions = []string{}
	if versions != "" {
		o.versions = strings.Split(versions, ",")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "csi-testregistrar: %v\n", err)
		return exitUsage
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "csi-testregistrar", Output: stderr, Level: hclog.Info})

	r, err := testregistrar.Start(testregistrar.Config{Dir: o.dir, Driver: o.driver, Endpoint: o.endpoint, Type: o.typ, Versions: o.versions})
	if err != nil {
		fmt.Fprintf(stderr, "csi-testregistrar: %v\n", err)
		return exitError
	}
	defer r.Stop()
	logger.Info("registration server started", "socket", r.Socket(), "type", o.typ, "endpoint", o.endpoint, "versions", o.versions)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	for n := range testregistrar.MaxStatuses {
		s, err := r.WaitStatus(ctx, n)
		if err != nil {
			logger.Info("stopping on signal")
			return exitOK
		}
		if !s.Registered {
			// As the sidecar: a refused registration is retried by
			// starting over, so the process ends.
			logger.Error("registration failed, exiting", "reason", s.Error)
			return exitError
		}
		logger.Info("registered")
		fmt.Fprintln(stdout, registeredLine)
	}
	// The registrar refuses further statuses; keep serving GetInfo.
	logger.Warn("status record full, no longer reporting registrations", "max", testregistrar.MaxStatuses)
	<-ctx.Done()
	logger.Info("stopping on signal")
	return exitOK
}
