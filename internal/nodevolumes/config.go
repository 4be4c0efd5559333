package nodevolumes

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// RecordsDir is the directory of the mount records under the data
// directory. It is not under <data_dir>/volumes, where the default mount
// roots are: a plugin may have any id.
const RecordsDir = "volume-mounts"

// DefaultReconcileInterval is how often the manager compares its cluster
// mounts with the servers' claims when Config.ReconcileInterval is zero.
const DefaultReconcileInterval = time.Minute

// EventSink receives the manager's volume events. The registry
// implements it and adds them to the node's event log.
type EventSink interface {
	Emit(plugin.Event)
}

// ClaimSource returns the claims the servers hold for this node and the
// state index they were read at. A cluster mount whose claim index is at
// most index and whose volume and workload are not among claims has been
// released by the servers without this node.
type ClaimSource func(ctx context.Context) (claims []*csisupdv1.NodeClaimRef, index uint64, err error)

// HealthReporter tells the servers what the node saw of a mounted
// volume's health, when it changed (the nodeclient's NodeVolumeHealth).
type HealthReporter func(ctx context.Context, volumeID string, abnormal bool, message string) error

// PluginDirs are the mount directories of one plugin.
type PluginDirs struct {
	// MountDir is the plugin's mount root on the host (config plugin
	// "<id>" { mount_dir }). Empty means <DataDir>/volumes/<id>.
	MountDir string
	// PluginMountDir is the path at which the plugin sees the mount root,
	// when it differs (a plugin in a container). Every path sent to the
	// plugin is the host path with the mount root replaced by it. Empty
	// means the plugin sees host paths.
	PluginMountDir string
}

// Config configures a Manager.
type Config struct {
	// DataDir is the agent's data directory. Required, absolute. Records
	// live in <DataDir>/volume-mounts (RecordsDir); a plugin's default mount root is
	// <DataDir>/volumes/<plugin id>.
	DataDir string
	// Plugins finds the plugins of this node (the registry's Manager).
	// Required.
	Plugins csiclient.PluginLookup
	// PluginDirs overrides the mount directories by plugin id. Optional.
	PluginDirs map[string]PluginDirs
	// NodeName names this node in PluginNotFound errors. Optional.
	NodeName string
	// RPCTimeout is the deadline of plugin calls whose context has none
	// (client.rpc_timeout). Required.
	RPCTimeout time.Duration
	// Retry spaces the attempts of one plugin call (csiclient.MaxAttempts
	// at most, as ClientCSI's) and the background attempts at finishing or
	// undoing a step (unbounded). Required: the agent's ClientCSI retry
	// policy.
	Retry retry.Policy
	// Events receives a volume event for every step done and every mount
	// that failed. Optional.
	Events EventSink
	// Logger receives the manager's logs. Optional.
	Logger hclog.Logger
	// Secrets adds the node's secrets of a plugin (its secrets file) to
	// every call made to it. Optional.
	Secrets csiclient.SecretSource
	// Claims, when set, makes Run remove the cluster mounts whose claim
	// the servers released (see ClaimSource). Optional.
	Claims ClaimSource
	// ReconcileInterval is how often Run asks Claims; zero means
	// DefaultReconcileInterval.
	ReconcileInterval time.Duration
	// QuietStart is how long after Run starts a "no cluster leader" answer
	// of Claims is logged at debug rather than warn, until a round first
	// succeeds: servers electing their first leader are the expected start
	// of a cluster.
	QuietStart time.Duration
	// Watchdog, when set, watches the reconcile loop ("volume reconcile")
	// and the health loop ("volume health").
	Watchdog *watchdog.Monitor
	// HealthReport, with HealthInterval, makes Run ask the plugins with
	// the GET_VOLUME_HEALTH node capability for the health of each
	// cluster mount every HealthInterval (client.volume_health_interval)
	// and report each change. Optional.
	HealthReport   HealthReporter
	HealthInterval time.Duration
}

// validate checks every field of cfg and reports all problems at once.
func (cfg *Config) validate() error {
	var errs []error
	switch {
	case cfg.DataDir == "":
		errs = append(errs, errors.New("volumes: Config.DataDir (data_dir) is required"))
	case !filepath.IsAbs(cfg.DataDir):
		errs = append(errs, fmt.Errorf("volumes: Config.DataDir (data_dir) %q is not absolute", cfg.DataDir))
	}
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("volumes: Config.Plugins is required"))
	}
	if cfg.RPCTimeout <= 0 {
		errs = append(errs, fmt.Errorf("volumes: Config.RPCTimeout (client.rpc_timeout) must be positive, got %s", cfg.RPCTimeout))
	}
	if err := cfg.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("volumes: Config.Retry: %w", err))
	}
	if cfg.HealthInterval < 0 {
		errs = append(errs, fmt.Errorf("volumes: Config.HealthInterval must not be negative, got %s", cfg.HealthInterval))
	}
	if cfg.ReconcileInterval < 0 {
		errs = append(errs, fmt.Errorf("volumes: Config.ReconcileInterval must not be negative, got %s", cfg.ReconcileInterval))
	}
	for _, id := range slices.Sorted(maps.Keys(cfg.PluginDirs)) {
		d := cfg.PluginDirs[id]
		if err := checkID("plugin id", id); err != nil {
			errs = append(errs, fmt.Errorf("volumes: Config.PluginDirs[%q]: %s", id, statusMessage(err)))
		}
		if d.MountDir != "" && !filepath.IsAbs(d.MountDir) {
			errs = append(errs, fmt.Errorf("volumes: Config.PluginDirs[%q].MountDir %q is not absolute", id, d.MountDir))
		}
		if d.PluginMountDir != "" && !filepath.IsAbs(d.PluginMountDir) {
			errs = append(errs, fmt.Errorf("volumes: Config.PluginDirs[%q].PluginMountDir %q is not absolute", id, d.PluginMountDir))
		}
	}
	return errors.Join(errs...)
}
