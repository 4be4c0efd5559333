package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/csisupd/csisupd/internal/agent"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testplugin"
)

func newAgentCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the csisupd daemon",
		Long: "Run the csisupd daemon. Configuration comes from HCL files (--config, repeatable; a\n" +
			"directory loads its *.hcl files in order), then the environment, then flags.\n" +
			"SIGHUP reloads log_level, enable_debug, the probe timing, the Consul settings and the event\n" +
			"stream caps; other changed keys are logged as taking effect after a restart, and a tls\n" +
			"change is refused (TLS stays as it started). A reload that does not finish within " + config.DefaultReloadTimeout.String() + " is\n" +
			"reported, and /v1/health answers 503 until it ends. SIGINT/SIGTERM stop gracefully.",
		Args: rangeArgs(0, 0),
	}
	flags := config.RegisterFlags(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		return runAgent(cmd.Context(), flags)
	}
	return cmd
}

func runAgent(parent context.Context, flags *config.Flags) error {
	load := func() (*config.Config, error) {
		// Load reads the --config paths from flags itself; passing them as
		// Files too would load every file twice.
		return config.Load(config.LoadInput{Flags: flags})
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	// An InterceptLogger lets `csisupd monitor` stream the agent's logs at
	// a level of its own.
	logger := hclog.NewInterceptLogger(&hclog.LoggerOptions{
		Name:       "csisupd",
		Level:      hclog.LevelFromString(cfg.LogLevel),
		JSONFormat: cfg.LogJSON,
		Output:     os.Stderr,
	})

	a, err := agent.New(agent.Config{Config: cfg, Version: currentBuild().Version, Logger: logger})
	if err != nil {
		return err
	}

	// A write to stderr whose reader is gone (`make run | tee` after tee
	// died) fails with EPIPE instead of killing the agent with SIGPIPE
	// before it stops cleanly and removes a dev temp directory; the logger
	// drops lines it cannot write.
	signal.Ignore(syscall.SIGPIPE)

	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if cfg.Dev {
		// The demo plugin logs every call at debug level; keep it at info so
		// the dev agent's own lines stay readable at any log_level.
		demoLog := hclog.New(&hclog.LoggerOptions{
			Name: "csisupd.demo-plugin", Level: hclog.Info, JSONFormat: cfg.LogJSON, Output: os.Stderr,
		})
		demo, err := startDemoPlugin(a, cfg.Name, demoLog)
		if err != nil {
			a.Close()
			return err
		}
		defer demo.Stop()
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				// The agent's reload loop runs it under a deadline; a
				// stuck reload never blocks this loop.
				a.RequestReload(load)
			}
		}
	}()

	return a.Run(ctx)
}

// startDemoPlugin serves the built-in test plugin in the dev agent's plugin
// directory, so `agent --dev` shows the whole system with one command.
func startDemoPlugin(a *agent.Agent, nodeName string, log hclog.Logger) (*testplugin.Plugin, error) {
	dir := filepath.Join(a.PluginDir(), "demo")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("demo plugin: %w", err)
	}
	// The demo clones and modifies volumes besides the default snapshots
	// and online expansion, so that the whole volume lifecycle can be
	// tried. It reports volume health, and a volume listed in its
	// conditions file ("<external id> <message>" lines) is abnormal, so
	// that volume status --health and the health events can be tried.
	conditions := filepath.Join(a.DataDir(), "demo-volume-conditions")
	p, err := testplugin.New(testplugin.Config{
		Socket:                 filepath.Join(dir, "csi.sock"),
		StateDir:               filepath.Join(a.DataDir(), "demo-plugin-state"),
		Type:                   testplugin.TypeMonolith,
		NodeID:                 nodeName,
		Topology:               map[string]string{"topology.csisupd.io/node": nodeName},
		ControllerCapabilities: demoControllerCapabilities(),
		VolumeHealth:           true,
		VolumeConditionsFile:   conditions,
		Logger:                 log,
	})
	if err != nil {
		return nil, fmt.Errorf("demo plugin: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("demo plugin: %w", err)
	}
	log.Info("demo plugin serving", "socket", filepath.Join(dir, "csi.sock"), "volume_conditions_file", conditions)
	return p, nil
}

// demoControllerCapabilities are the demo plugin's: the test plugin's
// defaults (snapshots and online expansion among them), cloning,
// modifying and the volume health calls.
func demoControllerCapabilities() []csi.ControllerServiceCapability_RPC_Type {
	return append(slices.Clone(testplugin.DefaultControllerCapabilities),
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH, csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH)
}
