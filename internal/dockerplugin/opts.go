package dockerplugin

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/volreq"
	"github.com/csisupd/csisupd/internal/volspec"
)

// minSize is the smallest size option taken: a bare number is bytes, and
// a size below a mebibyte is almost surely a number without its unit.
const minSize = 1 << 20

// Prefixes of the options that carry a key.
const (
	parameterPrefix = "parameter."
	secretPrefix    = "secret."
)

// knownOpts are Create's options, as the error of an unknown one lists
// them.
var knownOpts = []string{"access_mode", "access_type", "clone", "fs_type", "mount_flags", parameterPrefix + "<key>", "plugin", "size", "snapshot", "timeout", "topology"}

// createOpts are the options of a Create, read: the volume's
// specification, and the plugin the options named ("" when they named
// none and the default applies).
type createOpts struct {
	spec   volspec.Spec
	plugin string
	// defaultPlugin is Config.DefaultPlugin, used when plugin is "".
	defaultPlugin string
}

// parseOpts reads the options of a Create of volume name. Every problem
// is reported, in the order of the options' names.
func (s *Server) parseOpts(name string, opts map[string]string) (*createOpts, error) {
	o := &createOpts{defaultPlugin: s.cfg.DefaultPlugin, spec: volspec.Spec{ID: name}}
	capability := volspec.DefaultCapability
	var (
		errs       []error
		mountOpts  volspec.MountOptions
		mountGiven []string
	)
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		v := strings.TrimSpace(opts[k])
		if err := o.set(k, v, &capability, &mountOpts, &mountGiven); err != nil {
			errs = append(errs, err)
		}
	}
	if capability.AccessType == "block" && len(mountGiven) > 0 {
		errs = append(errs, fmt.Errorf("%s: apply to access_type mount only, not block", strings.Join(mountGiven, " and ")))
	}
	if o.spec.SnapshotID != "" && o.spec.CloneID != "" {
		errs = append(errs, errors.New("snapshot and clone: a volume starts from a snapshot or from another volume, not both"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("volume %q: %w", name, joinErrors(errs))
	}
	o.spec.Capabilities = []volspec.Capability{capability}
	if len(mountGiven) > 0 {
		o.spec.MountOptions = &mountOpts
	}
	return o, nil
}

// set reads option k with value v into o, the capability and the mount
// options; mountGiven collects the mount options given.
func (o *createOpts) set(k, v string, capability *volspec.Capability, mountOpts *volspec.MountOptions, mountGiven *[]string) error {
	switch {
	case k == "plugin":
		if !ids.ValidPluginID(v) {
			return fmt.Errorf("plugin %q is not a plugin id (%s)", v, ids.PluginIDPattern)
		}
		o.plugin = v
	case k == "size":
		n, err := volspec.ParseSize(v)
		switch {
		case err != nil:
			return fmt.Errorf("size: %w", err)
		case n < minSize:
			return fmt.Errorf("size %q is %d bytes, less than 1 MiB: give a unit, such as 16MiB or 10G", v, n)
		}
		o.spec.CapacityMin = n
	case k == "access_mode":
		mode, ok := volspec.AccessModes[strings.ReplaceAll(strings.ToLower(v), "_", "-")]
		if !ok {
			return fmt.Errorf("access_mode %q: must be one of %s", v, strings.Join(slices.Sorted(maps.Keys(volspec.AccessModes)), ", "))
		}
		capability.AccessMode = mode
	case k == "access_type":
		t := strings.ToLower(v)
		if nomad, ok := volspec.AttachmentModes[t]; ok {
			t = nomad
		}
		if t != "mount" && t != "block" {
			return fmt.Errorf("access_type %q: must be mount or block", v)
		}
		capability.AccessType = t
	case k == "fs_type":
		mountOpts.FSType = v
		*mountGiven = append(*mountGiven, k)
	case k == "mount_flags":
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				mountOpts.MountFlags = append(mountOpts.MountFlags, f)
			}
		}
		*mountGiven = append(*mountGiven, k)
	case k == "topology":
		segs, err := parseTopology(v)
		if err != nil {
			return err
		}
		o.spec.Required = segs
	case k == "snapshot" || k == "clone":
		if !ids.ValidPathID(v) {
			return fmt.Errorf("%s %q is not a csisupd id", k, v)
		}
		if k == "snapshot" {
			o.spec.SnapshotID = v
		} else {
			o.spec.CloneID = v
		}
	case k == "timeout":
		// Podman's own: its time for each call of the plugin, which it
		// passes on with the others (podman volume create -o timeout=N).
	case strings.HasPrefix(k, parameterPrefix):
		p := strings.TrimPrefix(k, parameterPrefix)
		if p == "" {
			return fmt.Errorf("%s: the parameter's key is missing (%s<key>=<value>)", k, parameterPrefix)
		}
		if o.spec.Parameters == nil {
			o.spec.Parameters = map[string]string{}
		}
		o.spec.Parameters[p] = v
	case strings.HasPrefix(k, secretPrefix):
		return fmt.Errorf("%s: secrets are not taken as options (anyone who can list volumes would see them); they come from the plugin's secrets file, plugin \"<id>\" { secrets_file = ... } in the agent's config", k)
	default:
		return fmt.Errorf("unknown option %q; the options are %s", k, strings.Join(knownOpts, ", "))
	}
	return nil
}

// parseTopology reads the topology option: required segments separated
// by ";", each K=V pairs separated by ",".
func parseTopology(v string) ([]map[string]string, error) {
	var segs []map[string]string
	for _, seg := range strings.Split(v, ";") {
		m := map[string]string{}
		for _, pair := range strings.Split(seg, ",") {
			k, val, ok := strings.Cut(pair, "=")
			k, val = strings.TrimSpace(k), strings.TrimSpace(val)
			switch {
			case !ok || k == "" || val == "":
				return nil, fmt.Errorf("topology %q: %q is not K=V; want K=V[,K=V...][;K=V...] (segments separated by ';')", v, strings.TrimSpace(pair))
			case m[k] != "":
				return nil, fmt.Errorf("topology %q: key %q given twice in one segment", v, k)
			}
			m[k] = val
		}
		segs = append(segs, m)
	}
	return segs, nil
}

// createRequest returns the CreateVolume request of the options, checked
// as the servers check it.
func (o *createOpts) createRequest() (*csisupdv1.VolumeCreateRequest, error) {
	spec := o.spec
	spec.PluginID = o.plugin
	if spec.PluginID == "" {
		spec.PluginID = o.defaultPlugin
	}
	if spec.PluginID == "" {
		return nil, fmt.Errorf("volume %q does not exist and no plugin is named: give -o plugin=<plugin id>, or set docker.default_plugin in the agent's config", spec.ID)
	}
	req, err := spec.CreateRequest()
	if err == nil {
		err = volreq.CreateVolume(req)
	}
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", spec.ID, err)
	}
	return req, nil
}

// joinErrors joins errs into one error whose text is one line, for an
// Err the engine prints.
func joinErrors(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return joined(errs)
}

// joined is several errors, printed on one line separated by "; ".
type joined []error

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, e := range j {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }
