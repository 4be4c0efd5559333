// Command csi-testplugin serves one or many test CSI plugins (package
// testplugin) in one process, for benchmarks and for tests that need a plugin
// process to kill.
//
// Usage:
//
//	csi-testplugin --socket PATH [flags]
//	csi-testplugin --dir DIR --count N [flags]
//
// With --dir, plugins p0000, p0001, ... listen on DIR/<id>/csi.sock, keep
// their state in <state-dir>/<id> and are named <id>.<name>. Flags take one
// or two dashes.
//
// Once every plugin listens, the command prints one line
// "csi-testplugin: serving N plugin(s)" to standard output. On SIGTERM or
// SIGINT it stops all plugins, removes their sockets and exits 0. SIGKILL
// leaves the sockets behind, as does --exit-after, which simulates a crash:
// after the given time the process exits with status 3 without any cleanup.
// Usage errors exit 2, other errors 1.
//
// With --mounts bind the node service makes real bind mounts (it needs
// root); they stay when the process exits, as a driver's do, and are the
// caller's to unmount. The default, --mounts marker, mounts nothing.
//
// The flags --node-local, --topology-key, --expansion,
// --node-expansion-required, --mutable-parameters, --snapshot-ready-after,
// --max-content-bytes, --volume-health, --volume-mount-group and
// --controller-capabilities set the testplugin.Config fields of the same
// names (see the package testplugin). --controller-capabilities takes CSI
// names, such as CLONE_VOLUME,MODIFY_VOLUME, plus "default" for the
// default ones and "all" for every supported one.
//
// With --probe-log FILE every Probe call a plugin serves appends the line
// "<plugin id> <unix nanoseconds>" to FILE, stamped when the answer is
// ready; the id is what csisupd calls the plugin (the directory of a
// csi.sock socket, else the socket's name without ".sock"). Lines are
// buffered and written at least every 100 ms and at exit, so soak tests
// can tell how regularly an agent probed.
//
// With --journal FILE every plugin appends a JSON record (see
// testplugin.JournalRecord) when a Node or Controller call begins and
// another before it answers, each synced first, so the file survives a
// SIGKILL with a record of every answer sent; the plugins of --dir share
// the file, their records telling them apart. A call whose record cannot
// be written fails with Internal. Package testplugin/journal reads the
// file and checks invariants on it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/hashicorp/go-hclog"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitCrash = testplugin.ExitCrash
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	socket       string
	dir          string
	count        int
	typ          string
	name         string
	nodeID       string
	stateDir     string
	maxVolumes   int64
	topology     string
	knownNodeIDs string
	probeDelay   time.Duration
	exitAfter    time.Duration
	logLevel     string
	probeLog     string
	journal      string
	mounts       string

	nodeLocal             bool
	foreignVolumes        bool
	slowDelay             time.Duration
	topologyKey           string
	expansion             string
	nodeExpansionRequired bool
	mutableParameters     *string // nil: not given, the default keys
	snapshotReadyAfter    int
	maxContentBytes       int64
	volumeHealth          bool
	volumeConditions      string
	volumeMountGroup      bool
	controllerCaps        string
	requireSecrets        string
}

// errUsage marks errors in the command line.
var errUsage = errors.New("usage")

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("csi-testplugin", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.socket, "socket", "", "serve one plugin on this unix socket")
	fs.StringVar(&o.dir, "dir", "", "serve --count plugins at DIR/<id>/csi.sock")
	fs.IntVar(&o.count, "count", 1, "number of plugins with --dir")
	fs.StringVar(&o.typ, "type", testplugin.TypeMonolith, "plugin type: controller, node or monolith")
	fs.StringVar(&o.name, "name", testplugin.DefaultName, "CSI plugin name (prefixed with <id>. with --dir)")
	fs.StringVar(&o.nodeID, "node-id", "", "node id (default: the host name)")
	fs.StringVar(&o.stateDir, "state-dir", "", "state directory (default: a temporary directory removed at exit)")
	fs.Int64Var(&o.maxVolumes, "max-volumes", 0, "max volumes per node (0 = no limit)")
	fs.StringVar(&o.topology, "topology", "", "accessible topology as key=value,key=value")
	fs.StringVar(&o.knownNodeIDs, "known-node-ids", "", "comma-separated node ids ControllerPublishVolume accepts besides --node-id; * accepts all")
	fs.DurationVar(&o.probeDelay, "probe-delay", 0, "delay every Probe answer")
	fs.DurationVar(&o.exitAfter, "exit-after", 0, "crash: exit with status 3 after this time, leaving sockets behind")
	fs.StringVar(&o.logLevel, "log-level", "warn", "log level: trace, debug, info, warn or error")
	fs.StringVar(&o.mounts, "mounts", testplugin.MountsMarker, "how the node service places volumes: marker (links, no privileges) or bind (real bind mounts, needs root)")
	fs.StringVar(&o.probeLog, "probe-log", "", "append \"<plugin id> <unix ns>\" to this file for every Probe served")
	fs.StringVar(&o.journal, "journal", "", "append a synced JSON record to this file when each Node and Controller call begins and before it answers")
	fs.BoolVar(&o.nodeLocal, "node-local", false, "behave like a node-local driver: topology {<topology-key>: <node-id>}, volumes only on this node")
	fs.BoolVar(&o.foreignVolumes, "foreign-volumes", false, "serve every well-formed volume id on the node service, as a network storage driver's node plugin does, not only the volumes this instance created")
	fs.DurationVar(&o.slowDelay, "slow-delay", 2*time.Second, "how long each Node and Controller call waits in slow mode (SIGUSR1 on, SIGUSR2 off); the wait outlasts the caller")
	fs.StringVar(&o.topologyKey, "topology-key", "", "topology key of --node-local (default "+testplugin.DefaultTopologyKey+")")
	fs.StringVar(&o.expansion, "expansion", testplugin.ExpansionOnline, "volume expansion: online, offline or none")
	fs.BoolVar(&o.nodeExpansionRequired, "node-expansion-required", false, "ControllerExpandVolume answers node_expansion_required=true")
	fs.Func("mutable-parameters", "comma-separated mutable parameter keys ControllerModifyVolume accepts; empty accepts none (default "+
		strings.Join(testplugin.DefaultMutableParameters, ",")+")", func(v string) error {
		o.mutableParameters = &v
		return nil
	})
	fs.IntVar(&o.snapshotReadyAfter, "snapshot-ready-after", 0, "report a new snapshot not ready in CreateSnapshot's answer and this many more answers")
	fs.Int64Var(&o.maxContentBytes, "max-content-bytes", testplugin.DefaultMaxContentBytes, "most file bytes a snapshot, restore or clone copies")
	fs.BoolVar(&o.volumeHealth, "volume-health", false, "advertise the node GET_VOLUME_HEALTH and GET_STORAGE_HEALTH capabilities")
	fs.StringVar(&o.volumeConditions, "volume-conditions", "", "report the volumes listed in this file abnormal (DEGRADED): \"<volume id> <message>\" lines, "+
		"read again by every health call")
	fs.BoolVar(&o.volumeMountGroup, "volume-mount-group", false, "advertise VOLUME_MOUNT_GROUP and accept volume_mount_group")
	fs.StringVar(&o.controllerCaps, "controller-capabilities", "", "comma-separated controller capabilities to advertise, by CSI name (CLONE_VOLUME); "+
		"\"default\" adds the default ones, \"all\" every supported one (default: the default ones)")
	fs.StringVar(&o.requireSecrets, "require-secrets", "", "refuse every call that can carry secrets without the secrets in this file "+
		"(key=value lines; kept off the command line, where any user can read it)")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("%w: %w", errUsage, err)
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	case (o.socket == "") == (o.dir == ""):
		return o, fmt.Errorf("%w: give exactly one of --socket and --dir", errUsage)
	case o.count < 1 || o.count > 10000:
		return o, fmt.Errorf("%w: --count %d is not between 1 and 10000", errUsage, o.count)
	case o.socket != "" && o.count != 1:
		return o, fmt.Errorf("%w: --count needs --dir", errUsage)
	case o.foreignVolumes && o.nodeLocal:
		return o, fmt.Errorf("%w: --foreign-volumes and --node-local exclude each other: a node-local driver serves only its own volumes", errUsage)
	case o.slowDelay <= 0:
		return o, fmt.Errorf("%w: --slow-delay must be positive", errUsage)
	case o.probeDelay < 0 || o.exitAfter < 0:
		return o, fmt.Errorf("%w: durations must not be negative", errUsage)
	case o.mounts != testplugin.MountsMarker && o.mounts != testplugin.MountsBind:
		return o, fmt.Errorf("%w: --mounts %q is not %s or %s", errUsage, o.mounts, testplugin.MountsMarker, testplugin.MountsBind)
	case hclog.LevelFromString(o.logLevel) == hclog.NoLevel:
		return o, fmt.Errorf("%w: --log-level %q is unknown", errUsage, o.logLevel)
	case o.expansion != testplugin.ExpansionOnline && o.expansion != testplugin.ExpansionOffline && o.expansion != testplugin.ExpansionNone:
		return o, fmt.Errorf("%w: --expansion %q is not %s, %s or %s", errUsage, o.expansion,
			testplugin.ExpansionOnline, testplugin.ExpansionOffline, testplugin.ExpansionNone)
	case o.snapshotReadyAfter < 0 || o.maxContentBytes < 1:
		return o, fmt.Errorf("%w: --snapshot-ready-after must not be negative and --max-content-bytes must be positive", errUsage)
	}
	return o, nil
}

// controllerCapabilities parses --controller-capabilities: CSI names,
// "default" and "all"; "" is nil, the plugin's default.
func controllerCapabilities(s string) ([]csi.ControllerServiceCapability_RPC_Type, error) {
	if s == "" {
		return nil, nil
	}
	var caps []csi.ControllerServiceCapability_RPC_Type
	for _, name := range strings.Split(s, ",") {
		switch name = strings.ToUpper(strings.TrimSpace(name)); name {
		case "DEFAULT":
			caps = append(caps, testplugin.DefaultControllerCapabilities...)
		case "ALL":
			caps = append(caps, testplugin.SupportedControllerCapabilities...)
		default:
			v, ok := csi.ControllerServiceCapability_RPC_Type_value[name]
			if !ok || v == 0 {
				return nil, fmt.Errorf("%w: --controller-capabilities: %q is not a controller capability", errUsage, name)
			}
			caps = append(caps, csi.ControllerServiceCapability_RPC_Type(v))
		}
	}
	return caps, nil
}

// pluginConfig is the Config the options give every plugin, before the
// per-plugin socket, state directory, name and logger.
func pluginConfig(o options) (testplugin.Config, error) {
	topology, err := keyValues(o.topology)
	if err != nil {
		return testplugin.Config{}, err
	}
	var known []string
	if o.knownNodeIDs != "" {
		known = strings.Split(o.knownNodeIDs, ",")
	}
	caps, err := controllerCapabilities(o.controllerCaps)
	if err != nil {
		return testplugin.Config{}, err
	}
	required, err := requiredSecrets(o.requireSecrets)
	if err != nil {
		return testplugin.Config{}, err
	}
	var mutable []string
	if o.mutableParameters != nil {
		mutable = []string{} // given empty: no key is mutable
		if *o.mutableParameters != "" {
			mutable = strings.Split(*o.mutableParameters, ",")
		}
	}
	return testplugin.Config{
		Name:                   o.name,
		Type:                   o.typ,
		NodeID:                 o.nodeID,
		MaxVolumes:             o.maxVolumes,
		Topology:               topology,
		KnownNodeIDs:           known,
		Mounts:                 o.mounts,
		ControllerCapabilities: caps,
		NodeLocal:              o.nodeLocal,
		ForeignVolumes:         o.foreignVolumes,
		TopologyKey:            o.topologyKey,
		Expansion:              o.expansion,
		NodeExpansionRequired:  o.nodeExpansionRequired,
		MutableParameters:      mutable,
		SnapshotReadyAfter:     o.snapshotReadyAfter,
		MaxContentBytes:        o.maxContentBytes,
		VolumeHealth:           o.volumeHealth,
		VolumeConditionsFile:   o.volumeConditions,
		VolumeMountGroup:       o.volumeMountGroup,
		RequiredSecrets:        required,
		Journal:                o.journal,
	}, nil
}

// requiredSecrets reads the key=value lines of --require-secrets; errors
// name the file and line, never a value.
func requiredSecrets(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--require-secrets: %w", err)
	}
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%w: --require-secrets %s:%d: not key=value", errUsage, path, i+1)
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out, nil
}

// keyValues parses "k=v,k=v".
func keyValues(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := make(map[string]string)
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: --topology: %q is not key=value", errUsage, kv)
		}
		m[k] = v
	}
	return m, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	// The run-time fault signals are caught before anything else: a
	// signal that arrives while the plugins start must not end the
	// process, as SIGUSR1, SIGUSR2 and SIGHUP do by default. They are
	// applied once the plugins serve.
	controls := make(chan os.Signal, 4)
	signal.Notify(controls, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	defer signal.Stop(controls)
	o, err := parse(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
		return exitUsage
	}
	base, err := pluginConfig(o)
	if err != nil {
		fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
		return exitUsage
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "csi-testplugin", Output: stderr, Level: hclog.LevelFromString(o.logLevel)})

	stateDir := o.stateDir
	if stateDir == "" {
		stateDir, err = os.MkdirTemp("", "csi-testplugin-")
		if err != nil {
			fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
			return exitError
		}
		defer os.RemoveAll(stateDir)
	}

	var probes *probeLog
	if o.probeLog != "" {
		probes, err = openProbeLog(o.probeLog, probeLogFlushInterval)
		if err != nil {
			fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
			return exitError
		}
		// Deferred before stopAll, so it runs after it: probes served
		// while the plugins stop are still written.
		defer func() {
			if err := probes.Close(); err != nil {
				fmt.Fprintf(stderr, "csi-testplugin: probe log: %v\n", err)
			}
		}()
	}

	var plugins []*testplugin.Plugin
	defer func() { stopAll(plugins) }()
	for i := range o.count {
		cfg := base
		cfg.Socket, cfg.StateDir, cfg.Logger = o.socket, stateDir, logger
		if o.dir != "" {
			id := fmt.Sprintf("p%04d", i)
			cfg.Socket = filepath.Join(o.dir, id, "csi.sock")
			cfg.StateDir = filepath.Join(stateDir, id)
			cfg.Name = id + "." + o.name
		}
		if probes != nil {
			cfg.Logger = probes.logger(logger, socketPluginID(cfg.Socket))
		}
		p, err := testplugin.New(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
			return exitError
		}
		p.SetFaults(testplugin.Faults{ProbeDelay: o.probeDelay})
		if err := p.Start(); err != nil {
			fmt.Fprintf(stderr, "csi-testplugin: %v\n", err)
			return exitError
		}
		plugins = append(plugins, p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fmt.Fprintf(stdout, "csi-testplugin: serving %d plugin(s)\n", len(plugins))

	var crash <-chan time.Time
	if o.exitAfter > 0 {
		crash = time.After(o.exitAfter)
	}
	// Faults at run time, for the soak tests: SIGUSR1 and SIGUSR2 turn
	// slow mode on and off, SIGHUP arms a crash in the next mutating call.
	for {
		select {
		case <-ctx.Done():
			logger.Info("stopping on signal")
			return exitOK
		case <-crash:
			// Like a crash: no deferred cleanup, sockets stay behind. The
			// probe log is the test's record, not plugin state: keep it whole.
			if probes != nil {
				_ = probes.Close()
			}
			os.Exit(exitCrash)
		case sig := <-controls:
			control(logger, plugins, sig, o.slowDelay)
		}
	}
}

// control applies a run-time fault signal to every plugin.
func control(logger hclog.Logger, plugins []*testplugin.Plugin, sig os.Signal, slowDelay time.Duration) {
	for _, p := range plugins {
		switch sig {
		case syscall.SIGUSR1:
			p.SetSlow(slowDelay)
		case syscall.SIGUSR2:
			p.SetSlow(0)
		case syscall.SIGHUP:
			p.ArmCrash()
		}
	}
	switch sig {
	case syscall.SIGUSR1:
		logger.Info("slow mode on", "delay", slowDelay)
	case syscall.SIGUSR2:
		logger.Info("slow mode off")
	case syscall.SIGHUP:
		logger.Info("armed: crashing in the next mutating call")
	}
}

// stopAll stops plugins concurrently; each removes its socket.
func stopAll(plugins []*testplugin.Plugin) {
	var wg sync.WaitGroup
	for _, p := range plugins {
		wg.Go(p.Stop)
	}
	wg.Wait()
}
