package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newVolumeCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Create, claim, mount, release, expand, snapshot, delete and inspect volumes",
		Args:  rangeArgs(0, 0),
	}
	cmd.AddCommand(
		newVolumeInitCommand(),
		newVolumeCreateCommand(opts),
		newVolumeRegisterCommand(opts),
		newVolumeDeleteCommand(opts),
		newVolumeDeregisterCommand(opts),
		newVolumeAvailabilityCommand(opts),
		newVolumeListCommand(opts),
		newVolumeStatusCommand(opts),
		newVolumeClaimCommand(opts),
		newVolumeReleaseCommand(opts),
		newVolumeRenewCommand(opts),
		newVolumeSyncCommand(opts),
		newVolumeCheckCommand(opts),
		newVolumeMountCommand(opts), newVolumeUnmountCommand(opts),
		newVolumeDetachCommand(opts),
		newVolumeExpandCommand(opts),
		newVolumeModifyCommand(opts),
		newVolumeSnapshotCommand(opts),
	)
	return cmd
}

// requireFlags returns a usage error naming the flags that are unset or
// empty.
func requireFlags(cmd *cobra.Command, names ...string) error {
	var missing []string
	for _, n := range names {
		if f := cmd.Flags().Lookup(n); f == nil || strings.TrimSpace(f.Value.String()) == "" {
			missing = append(missing, "--"+n)
		}
	}
	if len(missing) > 0 {
		return usageError{fmt.Errorf("required flag(s) %s not set", strings.Join(missing, ", "))}
	}
	return nil
}

// capabilityFlags are the flags that describe one volume capability.
type capabilityFlags struct {
	accessType string
	accessMode string
	fsType     string
	mountFlags []string
}

func (c *capabilityFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.accessType, "access-type", "mount", "mount or block")
	fs.StringVar(&c.accessMode, "access-mode", "single-node-writer",
		"CSI access mode, e.g. single-node-writer, single-node-reader-only, multi-node-multi-writer")
	fs.StringVar(&c.fsType, "fs-type", "", "file system type of a mount volume, e.g. ext4")
	fs.StringArrayVar(&c.mountFlags, "mount-flag", nil, "mount flag of a mount volume; repeatable")
}

// capability validates the flags and returns the capability they describe.
func (c *capabilityFlags) capability() (*csisupdv1.VolumeCapability, error) {
	mode, err := parseAccessMode(c.accessMode)
	if err != nil {
		return nil, err
	}
	switch c.accessType {
	case "mount":
	case "block":
		if c.fsType != "" || len(c.mountFlags) > 0 {
			return nil, usageError{errors.New("--fs-type and --mount-flag apply only to --access-type mount")}
		}
	default:
		return nil, usageError{fmt.Errorf("--access-type %q: must be mount or block", c.accessType)}
	}
	return &csisupdv1.VolumeCapability{
		AccessType: c.accessType, AccessMode: mode, FsType: c.fsType, MountFlags: c.mountFlags,
	}, nil
}

// parseAccessMode turns "single-node-writer" (any case, dashes or
// underscores) into the CSI name SINGLE_NODE_WRITER.
func parseAccessMode(s string) (string, error) {
	name := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	if v, ok := csi.VolumeCapability_AccessMode_Mode_value[name]; !ok || v == int32(csi.VolumeCapability_AccessMode_UNKNOWN) {
		var modes []string
		for n, v := range csi.VolumeCapability_AccessMode_Mode_value {
			if v != int32(csi.VolumeCapability_AccessMode_UNKNOWN) {
				modes = append(modes, strings.ToLower(strings.ReplaceAll(n, "_", "-")))
			}
		}
		sort.Strings(modes)
		return "", usageError{fmt.Errorf("--access-mode %q: must be one of %s", s, strings.Join(modes, ", "))}
	}
	return name, nil
}

// parseKeyValues turns repeated k=v flags into a map.
func parseKeyValues(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--%s %q: want key=value", flag, p)}
		}
		out[k] = v
	}
	return out, nil
}

func newVolumeDeleteCommand(opts *clientOptions) *cobra.Command {
	var (
		deregisterOnly bool
		secrets        []string
	)
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a volume in the plugin and forget it",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sec, err := parseKeyValues("secret", secrets)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: args[0], DeregisterOnly: deregisterOnly, Secrets: sec})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					// The claims a forced deregistration left (none without
					// --force), and exit code 0.
					return printProto(w, resp)
				}
				verb := "Deleted"
				if deregisterOnly {
					verb = "Deregistered"
				}
				_, err = fmt.Fprintf(w, "%s volume %s\n", verb, display(args[0]))
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&deregisterOnly, "deregister-only", false, "forget the volume without deleting it in the plugin")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

func newVolumeDeregisterCommand(opts *clientOptions) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "deregister ID [--force]",
		Short: "Forget a volume without deleting it in the plugin",
		Long: `Forget a volume without deleting it in the plugin (volume delete
--deregister-only).

--force forgets a volume that still has claims whose release cannot
finish, and prints each claim it forgot: what the nodes may still hold of
the volume (mounts, staging, controller publications), for an operator to
remove by hand.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: args[0], DeregisterOnly: true, Force: force})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				if _, err := fmt.Fprintf(w, "Deregistered volume %s\n", display(args[0])); err != nil {
					return err
				}
				if len(resp.GetClaimsLeft()) > 0 {
					fmt.Fprintf(w, "Left behind (%d claims; the nodes may still hold them):\n", len(resp.GetClaimsLeft()))
					for _, c := range resp.GetClaimsLeft() {
						fmt.Fprintf(w, "  node %s  workload %s  state %s  host path %s  staging path %s  controller published %v\n",
							display(c.GetNodeId()), display(c.GetWorkloadId()), display(c.GetState()), display(dash(c.GetHostPath())),
							display(dash(c.GetStagingPath())), c.GetControllerPublished())
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "forget the volume even with claims whose release cannot finish (needs operator:write with ACLs)")
	return cmd
}

func newVolumeAvailabilityCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "availability ID active|pause|drain",
		Short: "Set whether a volume takes new claims (pause), or also release its claims (drain)",
		Long: `Set whether a volume takes new claims.

active  takes new claims.
pause   refuses new claims (rule "availability"); the claims it has stay.
drain   refuses new claims and releases every claim it has, through the
        leader's volume watcher; follow them with
        "csisupd events --cluster --volume ID".`,
		Args: rangeArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[1] {
			case "active", "pause", "drain":
			default:
				return usageError{fmt.Errorf("availability %q: want active, pause or drain", args[1])}
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.SetVolumeAvailability(ctx, &csisupdv1.VolumeAvailabilityRequest{Id: args[0], Availability: args[1]})
				if err != nil {
					return controlError(opts.address, err)
				}
				return printVolumeResult(cmd.OutOrStdout(), opts.json, "Set availability "+args[1]+" of", resp.GetVolume())
			})
		},
	}
}

// resolveNode returns the id of the node named by arg: a node id, or the
// name of exactly one node. A name that is also another node's id, or
// that two nodes carry (records of an earlier release), is ambiguous: the
// error lists the candidates and none is picked. A node replaced after a
// rekey no longer holds its name.
func resolveNode(ctx context.Context, cl csisupdv1.ControlClient, arg string) (string, error) {
	var candidates []*csisupdv1.ClusterNode
	err := listAllPages(func(token string) (string, error) {
		page, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{NextToken: token})
		if err != nil {
			return "", err
		}
		for _, n := range page.GetNodes() {
			if n.GetId() == arg || n.GetName() == arg && n.GetReplacedBy() == "" {
				candidates = append(candidates, n)
			}
		}
		return page.GetNextToken(), nil
	})
	if err != nil {
		return "", err
	}
	switch len(candidates) {
	case 0:
		return "", status.Errorf(codes.NotFound, "node %q not found (neither a node id nor a node name)", arg)
	case 1:
		return candidates[0].GetId(), nil
	}
	list := make([]string, len(candidates))
	for i, n := range candidates {
		list[i] = fmt.Sprintf("%s (name %s, %s)", n.GetId(), dash(n.GetName()), n.GetStatus())
	}
	return "", status.Errorf(codes.InvalidArgument, "node %q is ambiguous: it names %s; pass the node id", arg, strings.Join(list, ", "))
}

func newVolumeListCommand(opts *clientOptions) *cobra.Command {
	var (
		pluginID string
		stale    bool
		pageSize uint32
		external bool
	)
	cmd := &cobra.Command{
		Use:   "list [--plugin P [--external]]",
		Short: "List the volumes of the cluster, or with --external what the plugin holds beside them",
		Long: `List the volumes of the cluster.

--external (with --plugin) lists the volumes the plugin's controllers hold
(ListVolumes) and marks each one known (with its cluster id) or unknown to
the cluster, and each volume of the cluster that no controller listed as
missing. Adopt an unknown one with "volume register --external-id".`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if external && pluginID == "" {
				return usageError{errors.New("--external needs --plugin")}
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if external {
					resp, err := cl.ListExternalVolumes(ctx, &csisupdv1.ExternalListRequest{PluginId: pluginID})
					if err != nil {
						return controlError(opts.address, err)
					}
					if opts.json {
						return printProto(cmd.OutOrStdout(), resp)
					}
					return printExternalVolumes(cmd.OutOrStdout(), resp)
				}
				resp := &csisupdv1.VolumeListResponse{}
				err := listAllPages(func(token string) (string, error) {
					page, err := cl.ListVolumes(ctx, &csisupdv1.VolumeListRequest{PluginId: pluginID, Stale: stale, PageSize: pageSize, NextToken: token})
					if err != nil {
						return "", controlError(opts.address, err)
					}
					resp.Volumes, resp.Index = append(resp.Volumes, page.GetVolumes()...), page.GetIndex()
					return page.GetNextToken(), nil
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				var names nodeNames
				if slices.ContainsFunc(resp.GetVolumes(), func(v *csisupdv1.Volume) bool { return len(v.GetClaims()) > 0 }) {
					names = listNodeNames(ctx, cl, stale)
				}
				return printVolumeList(w, resp.GetVolumes(), names)
			})
		},
	}
	cmd.Flags().StringVar(&pluginID, "plugin", "", "only volumes of this plugin")
	cmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	cmd.Flags().BoolVar(&external, "external", false, "list what the plugin holds, marked known, unknown or missing (needs --plugin)")
	pageFlag(cmd, &pageSize)
	return cmd
}

func newVolumeStatusCommand(opts *clientOptions) *cobra.Command {
	var stale, health bool
	cmd := &cobra.Command{
		Use:   "status ID [--health]",
		Short: "Show one volume with its claims, and with --health its health as the controller and each node see it now",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if health && stale {
				return usageError{errors.New("--health asks the plugins through the leader; it does not go with --stale")}
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if health {
					resp, err := cl.GetVolumeHealth(ctx, &csisupdv1.VolumeHealthGetRequest{Id: args[0]})
					if err != nil {
						return controlError(opts.address, err)
					}
					if opts.json {
						return printProto(cmd.OutOrStdout(), resp)
					}
					names := volumeNames(ctx, cl, resp.GetVolume(), false)
					if err := printVolume(cmd.OutOrStdout(), resp.GetVolume(), names); err != nil {
						return err
					}
					return printHealthAnswers(cmd.OutOrStdout(), resp.GetAnswers(), names)
				}
				resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: args[0], Stale: stale})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp.GetVolume())
				}
				return printVolume(cmd.OutOrStdout(), resp.GetVolume(), volumeNames(ctx, cl, resp.GetVolume(), stale))
			})
		},
	}
	cmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	cmd.Flags().BoolVar(&health, "health", false, "ask the volume's health now: the controller (ControllerGetVolumeHealth) and every node that mounts it (NodeGetVolumeHealth)")
	return cmd
}

// printHealthAnswers prints what each source said of a volume's health.
func printHealthAnswers(w io.Writer, answers []*csisupdv1.VolumeHealthAnswer, names nodeNames) error {
	fmt.Fprintln(w, "\nHealth now")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tNODE\tHEALTH\tMESSAGE")
	for _, a := range answers {
		state, msg := "normal", a.GetMessage()
		switch {
		case a.GetError() != "":
			state, msg = "unknown", a.GetError()
		case a.GetAbnormal():
			state = "abnormal"
		}
		row(tw, a.GetSource(), dash(names.label(a.GetNodeId())), state, dash(msg))
	}
	return tw.Flush()
}

// printVolumeResult prints the volume a write returned.
func printVolumeResult(w io.Writer, asJSON bool, verb string, v *csisupdv1.Volume) error {
	if asJSON {
		return printProto(w, v)
	}
	_, err := fmt.Fprintf(w, "%s volume %s (plugin %s, external id %s)\n", verb,
		display(v.GetId()), display(v.GetPluginId()), display(v.GetExternalId()))
	return err
}

func claimNodes(v *csisupdv1.Volume, names nodeNames) string {
	var nodes []string
	for _, c := range v.GetClaims() {
		if l := display(names.label(c.GetNodeId())); !slices.Contains(nodes, l) {
			nodes = append(nodes, l)
		}
	}
	if len(nodes) == 0 {
		return "-"
	}
	return strings.Join(nodes, ",")
}

func printVolumeList(w io.Writer, vols []*csisupdv1.Volume, names nodeNames) error {
	if len(vols) == 0 {
		_, err := fmt.Fprintln(w, "No volumes.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPLUGIN\tEXTERNAL ID\tCAPACITY\tCLAIMED ON")
	for _, v := range vols {
		row(tw, v.GetId(), v.GetPluginId(), dash(v.GetExternalId()), formatBytes(v.GetCapacityBytes()), claimNodes(v, names))
	}
	return tw.Flush()
}

// field writes one "Label: value" line of a detail view, the value
// passed through display.
func field(w io.Writer, label, value string) {
	fmt.Fprintf(w, "%-20s%s\n", label+":", display(value))
}

// formatMap prints a map as sorted k=v pairs, or "-" when empty.
func formatMap(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// formatSegments prints topology segments as "k=v,k=v; k=v", or "-".
func formatSegments(segs []*csisupdv1.TopologySegment) string {
	if len(segs) == 0 {
		return "-"
	}
	parts := make([]string, len(segs))
	for i, s := range segs {
		parts[i] = formatMap(s.GetSegments())
	}
	return strings.Join(parts, "; ")
}

// formatSource names what a volume was created from.
func formatSource(src *csisupdv1.VolumeContentSource) string {
	switch {
	case src.GetSnapshotId() != "":
		return "snapshot " + src.GetSnapshotId()
	case src.GetVolumeId() != "":
		return "volume " + src.GetVolumeId()
	}
	return "-"
}

// formatList prints a list of names, or "-" when empty.
func formatList(l []string) string {
	if len(l) == 0 {
		return "-"
	}
	return strings.Join(l, ", ")
}

// printVolume prints a volume's status, each node it names with its name
// where names knows it.
func printVolume(w io.Writer, v *csisupdv1.Volume, names nodeNames) error {
	field(w, "ID", v.GetId())
	field(w, "Plugin", v.GetPluginId())
	field(w, "External ID", dash(v.GetExternalId()))
	field(w, "Capacity", formatBytes(v.GetCapacityBytes()))
	field(w, "Capacity limit", formatBytes(v.GetCapacityLimitBytes()))
	field(w, "Content source", formatSource(v.GetContentSource()))
	field(w, "Controller", dash(names.label(v.GetControllerNodeId())))
	field(w, "Created", dash(formatTime(v.GetCreatedAt())))
	field(w, "Topology", formatSegments(v.GetAccessibleTopology()))
	field(w, "Parameters", formatMap(v.GetParameters()))
	field(w, "Mutable parameters", formatMap(v.GetMutableParameters()))
	field(w, "Availability", availabilityName(v.GetAvailability()))
	for _, c := range v.GetCapabilities() {
		field(w, "Capability", strings.TrimSpace(c.GetAccessType()+" "+accessModeName(c.GetAccessMode())+" "+c.GetFsType()))
	}
	for _, c := range v.GetConditions() {
		field(w, "Abnormal", fmt.Sprintf("%s since %s: %s", c.GetSource(), formatTime(c.GetSince()), c.GetMessage()))
	}
	if e := v.GetExpansion(); e != nil {
		fmt.Fprintln(w, "\nExpansion under way")
		target := formatBytes(e.GetCapacityBytes())
		if e.GetLimitBytes() > 0 {
			target += " (limit " + formatBytes(e.GetLimitBytes()) + ")"
		}
		field(w, "Target", target)
		field(w, "State", dash(e.GetState()))
		field(w, "Started", dash(formatTime(e.GetStartedAt())))
		field(w, "Nodes pending", formatList(names.labels(e.GetNodesPending())))
		field(w, "Nodes done", formatList(names.labels(e.GetNodesDone())))
		field(w, "Last error", dash(e.GetLastError()))
	}
	if len(v.GetClaims()) == 0 {
		_, err := fmt.Fprintln(w, "\nNo claims.")
		return err
	}
	fmt.Fprintln(w, "\nClaims")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tWORKLOAD\tSTATE\tMODE\tREAD ONLY\tHOST PATH\tCLAIMED\tLAST ERROR")
	var forced []*csisupdv1.VolumeClaim
	for _, c := range v.GetClaims() {
		state := c.GetState()
		if c.GetForced() {
			state += " (forced)"
			forced = append(forced, c)
		}
		row(tw, names.label(c.GetNodeId()), dash(c.GetWorkloadId()), dash(state), dash(accessModeName(c.GetUsage().GetAccessMode())),
			fmt.Sprint(c.GetReadOnly()), dash(c.GetHostPath()), dash(formatTime(c.GetClaimedAt())), dash(c.GetLastError()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printClaimLeases(w, v.GetClaims(), names); err != nil {
		return err
	}
	for _, c := range forced {
		for _, s := range c.GetSkippedSteps() {
			fmt.Fprintf(w, "Skipped by force (node %s, workload %s): %s\n", display(names.label(c.GetNodeId())), display(c.GetWorkloadId()), display(s))
		}
	}
	return nil
}

// availabilityName names a volume's stored availability: "" is active.
func availabilityName(a string) string {
	if a == "" {
		return "active"
	}
	return a
}

// printExternalVolumes prints ListExternalVolumes' answer.
func printExternalVolumes(w io.Writer, r *csisupdv1.ExternalVolumesResponse) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tEXTERNAL ID\tCLUSTER ID\tCAPACITY\tTOPOLOGY\tCONTROLLERS")
	for _, v := range r.GetVolumes() {
		row(tw, v.GetState(), v.GetExternalId(), dash(v.GetClusterId()), formatBytes(v.GetCapacityBytes()),
			formatSegments(v.GetAccessibleTopology()), formatList(v.GetControllerNodeIds()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printListingGaps(w, r.GetComplete(), r.GetTruncated(), r.GetErrors())
}

// printListingGaps says why an external listing marked nothing missing.
func printListingGaps(w io.Writer, complete, truncated bool, errs []string) error {
	if complete {
		return nil
	}
	fmt.Fprintln(w, "\nIncomplete: nothing is marked missing.")
	if truncated {
		fmt.Fprintln(w, "The listing was cut at its cap of entries.")
	}
	for _, e := range errs {
		fmt.Fprintf(w, "Not listed: %s\n", display(e))
	}
	return nil
}
