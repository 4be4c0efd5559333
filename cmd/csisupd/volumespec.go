package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/safefile"
	"github.com/csisupd/csisupd/internal/volspec"
)

// readSpec parses the specification file of -f; "-" reads it from in.
func readSpec(path string, in io.Reader) (*volspec.Spec, error) {
	if path == "-" {
		return volspec.Read("stdin", in)
	}
	data, err := safefile.Read(context.Background(), path, safefile.Spec{What: "volume specification", MaxSize: volspec.MaxFileSize})
	if err != nil {
		return nil, err
	}
	return volspec.Read(path, bytes.NewReader(data))
}

// parseSegments turns repeated --topology-* flags into topology segments:
// each flag is one segment, K=V pairs separated by commas.
func parseSegments(flag string, values []string) ([]map[string]string, error) {
	var out []map[string]string
	for _, v := range values {
		seg := map[string]string{}
		for _, pair := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(pair, "=")
			k, val = strings.TrimSpace(k), strings.TrimSpace(val)
			switch {
			case strings.TrimSpace(pair) == "":
				return nil, usageError{fmt.Errorf("--%s %q: empty K=V pair; want K=V[,K=V...]", flag, v)}
			case !ok || k == "":
				return nil, usageError{fmt.Errorf("--%s %q: %q is not K=V; want K=V[,K=V...]", flag, v, pair)}
			case val == "":
				return nil, usageError{fmt.Errorf("--%s %q: topology key %q has no value", flag, v, k)}
			}
			if _, dup := seg[k]; dup {
				return nil, usageError{fmt.Errorf("--%s %q: topology key %q given twice in one segment", flag, v, k)}
			}
			seg[k] = val
		}
		out = append(out, seg)
	}
	return out, nil
}

// mergeKeyValues sets the k=v pairs of a repeated flag over m (the file's
// map), key by key, and returns the result.
func mergeKeyValues(flag string, pairs []string, m map[string]string) (map[string]string, error) {
	kv, err := parseKeyValues(flag, pairs)
	if err != nil || len(kv) == 0 {
		return m, err
	}
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, kv)
	return out, nil
}

// applyCapability sets the spec's capability from the capability flags:
// without a file always (their defaults are volume create's), with one
// only when --access-type or --access-mode is given, replacing the file's
// capability blocks. --fs-type and --mount-flag override the file's
// mount_options.
func (c *capabilityFlags) apply(fs *pflag.FlagSet, s *volspec.Spec) error {
	if s.File == "" || fs.Changed("access-type") || fs.Changed("access-mode") {
		vc, err := c.capability()
		if err != nil {
			return err
		}
		s.Capabilities = []volspec.Capability{{AccessMode: vc.GetAccessMode(), AccessType: vc.GetAccessType()}}
	}
	if fs.Changed("fs-type") || fs.Changed("mount-flag") {
		if s.MountOptions == nil {
			s.MountOptions = &volspec.MountOptions{}
		}
		if fs.Changed("fs-type") {
			s.MountOptions.FSType = c.fsType
		}
		if fs.Changed("mount-flag") {
			s.MountOptions.MountFlags = c.mountFlags
		}
	}
	return nil
}

// sizeFlag parses the size flag name into *dst when it was given.
func sizeFlag(fs *pflag.FlagSet, name, value string, dst *int64) error {
	if !fs.Changed(name) {
		return nil
	}
	n, err := parseSizeFlag(name, value)
	if err != nil {
		return err
	}
	*dst = n
	return nil
}

// checkCapacities refuses, as a usage error, a minimum over the maximum
// once a capacity flag changed either: the spec's own check would name
// the file's line of a value the flag replaced.
func checkCapacities(fs *pflag.FlagSet, s *volspec.Spec) error {
	if !fs.Changed("capacity") && !fs.Changed("capacity-max") {
		return nil
	}
	if s.CapacityMax > 0 && s.CapacityMin > s.CapacityMax {
		return usageError{fmt.Errorf("--capacity, --capacity-max: the capacity, %s, is more than the maximum, %s",
			formatBytes(s.CapacityMin), formatBytes(s.CapacityMax))}
	}
	return nil
}

// applyShape sets the flags create and register share over the spec:
// --capacity, --capacity-max (checked together) and the capability flags.
func applyShape(fs *pflag.FlagSet, s *volspec.Spec, capacity, capacityMax string, caps *capabilityFlags) error {
	if err := sizeFlag(fs, "capacity", capacity, &s.CapacityMin); err != nil {
		return err
	}
	if err := sizeFlag(fs, "capacity-max", capacityMax, &s.CapacityMax); err != nil {
		return err
	}
	if err := checkCapacities(fs, s); err != nil {
		return err
	}
	return caps.apply(fs, s)
}

// specBase returns the spec of -f (an empty one without it) with the
// NAME argument as its id.
func specBase(file string, args []string, in io.Reader) (*volspec.Spec, error) {
	s := &volspec.Spec{}
	if file != "" {
		var err error
		if s, err = readSpec(file, in); err != nil {
			return nil, err
		}
	}
	if len(args) > 0 {
		s.ID = args[0]
	}
	if s.ID == "" {
		if file == "" {
			return nil, usageError{errors.New("give the volume's NAME, or -f SPEC.hcl")}
		}
		return nil, usageError{fmt.Errorf("%s sets no id: set id in it or give NAME", file)}
	}
	return s, nil
}

// requireSpecFlag fails, as a usage error, when neither the file nor the
// flag sets a required key.
func requireSpecFlag(file, value, key, flag string) error {
	if value != "" {
		return nil
	}
	if file == "" {
		return usageError{fmt.Errorf("required flag(s) --%s not set", flag)}
	}
	return usageError{fmt.Errorf("%s sets no %s: set it in the file or give --%s", file, key, flag)}
}

// createFlags are the flags of volume create.
type createFlags struct {
	file        string
	pluginID    string
	capacity    string
	capacityMax string
	caps        capabilityFlags
	params      []string
	mutable     []string
	secrets     []string
	required    []string
	preferred   []string
	snapshot    string
	clone       string
}

func (f *createFlags) register(fs *pflag.FlagSet) {
	fs.StringVarP(&f.file, "file", "f", "", "volume specification file (Nomad's format, HCL or JSON; - reads standard input); flags given beside it override its keys")
	fs.StringVar(&f.pluginID, "plugin", "", "plugin id (required without -f)")
	fs.StringVar(&f.capacity, "capacity", "", "minimum capacity, e.g. 1GiB")
	fs.StringVar(&f.capacityMax, "capacity-max", "", "maximum capacity, e.g. 2GiB: the most the volume may grow to")
	f.caps.register(fs)
	fs.StringArrayVar(&f.params, "parameter", nil, "plugin parameter key=value; repeatable")
	fs.StringArrayVar(&f.mutable, "mutable-parameter", nil, "mutable parameter key=value, changed later with volume modify; repeatable")
	fs.StringArrayVar(&f.secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	fs.StringArrayVar(&f.required, "topology-required", nil,
		"a topology segment K=V[,K=V...] the volume must be accessible from (at least one of them); repeatable, one segment each")
	fs.StringArrayVar(&f.preferred, "topology-preferred", nil,
		"a topology segment K=V[,K=V...] to create the volume in, tried in order; repeatable, one segment each")
	fs.StringVar(&f.snapshot, "snapshot", "", "restore the snapshot with this id into the new volume")
	fs.StringVar(&f.clone, "clone", "", "clone the volume with this id into the new volume")
}

// request builds the CreateVolume request: the file's spec, if any, with
// the NAME argument and every flag given set over it.
func (f *createFlags) request(fs *pflag.FlagSet, args []string, in io.Reader) (*csisupdv1.VolumeCreateRequest, error) {
	if fs.Changed("snapshot") && fs.Changed("clone") {
		return nil, usageError{errors.New("--snapshot and --clone are exclusive: a volume starts from a snapshot or from another volume, not both")}
	}
	for _, name := range []string{"snapshot", "clone"} {
		if v, _ := fs.GetString(name); fs.Changed(name) && v == "" {
			return nil, usageError{fmt.Errorf("--%s: empty id", name)}
		}
	}
	s, err := specBase(f.file, args, in)
	if err != nil {
		return nil, err
	}
	if fs.Changed("plugin") {
		s.PluginID = f.pluginID
	}
	if err := requireSpecFlag(f.file, s.PluginID, "plugin_id", "plugin"); err != nil {
		return nil, err
	}
	if err := applyShape(fs, s, f.capacity, f.capacityMax, &f.caps); err != nil {
		return nil, err
	}
	if s.Parameters, err = mergeKeyValues("parameter", f.params, s.Parameters); err != nil {
		return nil, err
	}
	if s.MutableParameters, err = mergeKeyValues("mutable-parameter", f.mutable, s.MutableParameters); err != nil {
		return nil, err
	}
	secrets, err := mergeKeyValues("secret", f.secrets, s.Secrets)
	if err != nil {
		return nil, err
	}
	s.Secrets = secrets
	if fs.Changed("topology-required") {
		if s.Required, err = parseSegments("topology-required", f.required); err != nil {
			return nil, err
		}
	}
	if fs.Changed("topology-preferred") {
		if s.Preferred, err = parseSegments("topology-preferred", f.preferred); err != nil {
			return nil, err
		}
	}
	// A content source flag replaces the file's, whichever kind it was.
	if fs.Changed("snapshot") {
		s.SnapshotID, s.CloneID = f.snapshot, ""
	}
	if fs.Changed("clone") {
		s.SnapshotID, s.CloneID = "", f.clone
	}
	return s.CreateRequest()
}

func newVolumeCreateCommand(opts *clientOptions) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create NAME --plugin PLUGIN | create [NAME] -f SPEC.hcl",
		Short: "Create a volume through a healthy controller of the plugin",
		Long: `Create a volume through a healthy controller of the plugin, and record it.

The volume is described by flags, or by a volume specification file (-f,
Nomad's format in HCL or JSON; csisupd volume init prints one). Flags given
beside -f override the file: NAME its id, --plugin, --capacity and
--capacity-max their keys, --access-type or --access-mode its capability
blocks (with one), --fs-type and --mount-flag its mount_options,
--topology-required and --topology-preferred its topology_request segments,
--snapshot and --clone its snapshot_id and clone_id; --parameter,
--mutable-parameter and --secret set their keys over the file's.

--topology-required and --topology-preferred take one segment each, such as
zone=us-east-1a,rack=r1; repeat them for more segments. The volume must be
accessible from at least one required segment; preferred ones are tried in
order.`,
		Example: `  csisupd volume create data --plugin ebs --capacity 10GiB --topology-required zone=us-east-1a
  csisupd volume create data --plugin ebs --snapshot data-nightly
  csisupd volume create -f volume.hcl --capacity 20GiB`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := f.request(cmd.Flags(), args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if v := existingVolume(ctx, cl, req); v != nil {
					return reportExisting(cmd.OutOrStdout(), opts.json, v, req)
				}
				resp, err := cl.CreateVolume(ctx, req)
				if err != nil {
					return controlError(opts.address, err)
				}
				return printVolumeResult(cmd.OutOrStdout(), opts.json, "Created", resp.GetVolume())
			})
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// registerFlags are the flags of volume register.
type registerFlags struct {
	file        string
	pluginID    string
	externalID  string
	capacity    string
	capacityMax string
	caps        capabilityFlags
	volCtx      []string
	params      []string
}

func (f *registerFlags) register(fs *pflag.FlagSet) {
	fs.StringVarP(&f.file, "file", "f", "", "volume specification file (Nomad's format, HCL or JSON; - reads standard input); flags given beside it override its keys")
	fs.StringVar(&f.pluginID, "plugin", "", "plugin id (required without -f)")
	fs.StringVar(&f.externalID, "external-id", "", "the volume id in the storage provider (required without -f)")
	fs.StringVar(&f.capacity, "capacity", "", "capacity of the volume, e.g. 1GiB")
	fs.StringVar(&f.capacityMax, "capacity-max", "", "the most the volume may grow to, e.g. 2GiB")
	f.caps.register(fs)
	fs.StringArrayVar(&f.volCtx, "context", nil, "volume context key=value; repeatable")
	fs.StringArrayVar(&f.params, "parameter", nil, "parameter key=value to record; repeatable")
}

// volume builds the volume to register: the file's spec, if any, with the
// NAME argument and every flag given set over it.
func (f *registerFlags) volume(fs *pflag.FlagSet, args []string, in io.Reader) (*csisupdv1.Volume, error) {
	s, err := specBase(f.file, args, in)
	if err != nil {
		return nil, err
	}
	if fs.Changed("plugin") {
		s.PluginID = f.pluginID
	}
	if fs.Changed("external-id") {
		s.ExternalID = f.externalID
	}
	if err := requireSpecFlag(f.file, s.PluginID, "plugin_id", "plugin"); err != nil {
		return nil, err
	}
	if err := requireSpecFlag(f.file, s.ExternalID, "external_id", "external-id"); err != nil {
		return nil, err
	}
	if err := applyShape(fs, s, f.capacity, f.capacityMax, &f.caps); err != nil {
		return nil, err
	}
	if s.Context, err = mergeKeyValues("context", f.volCtx, s.Context); err != nil {
		return nil, err
	}
	if s.Parameters, err = mergeKeyValues("parameter", f.params, s.Parameters); err != nil {
		return nil, err
	}
	return s.Volume()
}

func newVolumeRegisterCommand(opts *clientOptions) *cobra.Command {
	var f registerFlags
	cmd := &cobra.Command{
		Use:   "register ID --plugin PLUGIN --external-id EXTERNAL_ID | register [ID] -f SPEC.hcl",
		Short: "Record a volume that already exists in the storage provider",
		Long: `Record a volume that already exists in the storage provider, without calling
the plugin.

The volume is described by flags, or by a volume specification file (-f,
Nomad's format in HCL or JSON; csisupd volume init --register prints one).
Flags given beside -f override the file's keys as they do for volume
create; --context and --parameter set their keys over the file's.`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := f.volume(cmd.Flags(), args, cmd.InOrStdin())
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: v})
				if err != nil {
					return controlError(opts.address, err)
				}
				return printVolumeResult(cmd.OutOrStdout(), opts.json, "Registered", resp.GetVolume())
			})
		},
	}
	f.register(cmd.Flags())
	return cmd
}

func newVolumeInitCommand() *cobra.Command {
	var register bool
	cmd := &cobra.Command{
		Use:   "init [--register]",
		Short: "Print an example volume specification file",
		Long: `Print an example volume specification file for volume create -f (with
--register, for volume register -f): every key, the optional ones commented
out, each with what it does.`,
		Example: `  csisupd volume init > volume.hcl
  csisupd volume create -f volume.hcl`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if json, _ := cmd.Flags().GetBool("json"); json {
				return usageError{errors.New("--json: volume init prints an HCL file, not JSON")}
			}
			example := volspec.ExampleCreate
			if register {
				example = volspec.ExampleRegister
			}
			_, err := io.WriteString(cmd.OutOrStdout(), example)
			return err
		},
	}
	cmd.Flags().BoolVar(&register, "register", false, "an example for volume register")
	return cmd
}
