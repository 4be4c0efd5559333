package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newVolumeSnapshotCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Create, list, inspect and delete volume snapshots",
		Long: `Create, list, inspect and delete volume snapshots. A snapshot is taken through
a controller of the volume's plugin (the CREATE_DELETE_SNAPSHOT capability)
and recorded by the cluster under its id; volume create --snapshot ID restores
one into a new volume.`,
		Args: rangeArgs(0, 0),
	}
	cmd.AddCommand(
		newSnapshotCreateCommand(opts),
		newSnapshotListCommand(opts),
		newSnapshotStatusCommand(opts),
		newSnapshotDeleteCommand(opts),
	)
	return cmd
}

// snapshotCreateRequest builds the CreateVolumeSnapshot request of
// volume snapshot create.
func snapshotCreateRequest(volume, id string, params, secrets []string) (*csisupdv1.VolumeSnapshotCreateRequest, error) {
	req := &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: volume, Id: id}
	var err error
	if req.Parameters, err = parseKeyValues("parameter", params); err != nil {
		return nil, err
	}
	if req.Secrets, err = parseKeyValues("secret", secrets); err != nil {
		return nil, err
	}
	return req, nil
}

func newSnapshotCreateCommand(opts *clientOptions) *cobra.Command {
	var params, secrets []string
	cmd := &cobra.Command{
		Use:     "create VOLUME SNAPSHOT",
		Short:   "Snapshot a volume; SNAPSHOT is the snapshot's id in the cluster",
		Example: `  csisupd volume snapshot create data data-nightly`,
		Args:    rangeArgs(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := snapshotCreateRequest(args[0], args[1], params, secrets)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.CreateVolumeSnapshot(ctx, req)
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp.GetSnapshot())
				}
				s := resp.GetSnapshot()
				_, err = fmt.Fprintf(w, "Created snapshot %s of volume %s (plugin %s, external id %s, %s, %s)\n",
					display(s.GetId()), display(s.GetSourceVolumeId()), display(s.GetPluginId()),
					display(dash(s.GetExternalId())), formatBytes(s.GetSizeBytes()), readiness(s))
				return err
			})
		},
	}
	cmd.Flags().StringArrayVar(&params, "parameter", nil, "plugin parameter key=value for CreateSnapshot; repeatable")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

// readiness says whether a snapshot can be restored from yet.
func readiness(s *csisupdv1.VolumeSnapshot) string {
	if s.GetReadyToUse() {
		return "ready to use"
	}
	return "not ready to use yet"
}

func newSnapshotListCommand(opts *clientOptions) *cobra.Command {
	var (
		volumeID, pluginID string
		stale              bool
		pageSize           uint32
		external           bool
	)
	cmd := &cobra.Command{
		Use:   "list [--volume VOLUME] [--plugin PLUGIN [--external]]",
		Short: "List the snapshots of the cluster, or with --external what the plugin holds beside them",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if external && (pluginID == "" || volumeID != "") {
				return usageError{errors.New("--external needs --plugin, and not --volume")}
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if external {
					resp, err := cl.ListExternalSnapshots(ctx, &csisupdv1.ExternalListRequest{PluginId: pluginID})
					if err != nil {
						return controlError(opts.address, err)
					}
					if opts.json {
						return printProto(cmd.OutOrStdout(), resp)
					}
					return printExternalSnapshots(cmd.OutOrStdout(), resp)
				}
				resp := &csisupdv1.VolumeSnapshotListResponse{}
				err := listAllPages(func(token string) (string, error) {
					page, err := cl.ListVolumeSnapshots(ctx, &csisupdv1.VolumeSnapshotListRequest{
						VolumeId: volumeID, PluginId: pluginID, Stale: stale, PageSize: pageSize, NextToken: token,
					})
					if err != nil {
						return "", controlError(opts.address, err)
					}
					resp.Snapshots, resp.Index = append(resp.Snapshots, page.GetSnapshots()...), page.GetIndex()
					return page.GetNextToken(), nil
				})
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				return printSnapshotList(w, resp.GetSnapshots())
			})
		},
	}
	cmd.Flags().StringVar(&volumeID, "volume", "", "only snapshots of this volume")
	cmd.Flags().StringVar(&pluginID, "plugin", "", "only snapshots of this plugin")
	cmd.Flags().BoolVar(&external, "external", false, "list the snapshots the plugin holds (ListSnapshots), marked known, unknown or missing (needs --plugin)")
	cmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	pageFlag(cmd, &pageSize)
	return cmd
}

func printSnapshotList(w io.Writer, snaps []*csisupdv1.VolumeSnapshot) error {
	if len(snaps) == 0 {
		_, err := fmt.Fprintln(w, "No snapshots.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tVOLUME\tPLUGIN\tEXTERNAL ID\tSIZE\tREADY\tSTATE\tCREATED")
	for _, s := range snaps {
		row(tw, s.GetId(), dash(s.GetSourceVolumeId()), s.GetPluginId(), dash(s.GetExternalId()),
			formatBytes(s.GetSizeBytes()), fmt.Sprint(s.GetReadyToUse()), dash(s.GetState()), dash(formatTime(s.GetCreatedAt())))
	}
	return tw.Flush()
}

func newSnapshotStatusCommand(opts *clientOptions) *cobra.Command {
	var stale bool
	cmd := &cobra.Command{
		Use:   "status SNAPSHOT",
		Short: "Show one snapshot",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: args[0], Stale: stale})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp.GetSnapshot())
				}
				return printSnapshot(cmd.OutOrStdout(), resp.GetSnapshot())
			})
		},
	}
	cmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	return cmd
}

func printSnapshot(w io.Writer, s *csisupdv1.VolumeSnapshot) error {
	field(w, "ID", s.GetId())
	field(w, "Volume", dash(s.GetSourceVolumeId()))
	field(w, "Plugin", s.GetPluginId())
	field(w, "External ID", dash(s.GetExternalId()))
	field(w, "Size", formatBytes(s.GetSizeBytes()))
	field(w, "Ready to use", fmt.Sprint(s.GetReadyToUse()))
	field(w, "State", dash(s.GetState()))
	field(w, "Controller", dash(s.GetControllerNodeId()))
	field(w, "Created", dash(formatTime(s.GetCreatedAt())))
	field(w, "Topology", formatSegments(s.GetAccessibleTopology()))
	_, err := fmt.Fprintf(w, "%-20s%s\n", "Last error:", display(dash(s.GetLastError())))
	return err
}

func newSnapshotDeleteCommand(opts *clientOptions) *cobra.Command {
	var secrets []string
	cmd := &cobra.Command{
		Use:   "delete SNAPSHOT",
		Short: "Delete a snapshot in the plugin and forget it",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sec, err := parseKeyValues("secret", secrets)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: args[0], Secrets: sec})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					// The call's response has no fields: {} and exit code 0.
					return printProto(w, resp)
				}
				_, err = fmt.Fprintf(w, "Deleted snapshot %s\n", display(args[0]))
				return err
			})
		},
	}
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

// printExternalSnapshots prints ListExternalSnapshots' answer.
func printExternalSnapshots(w io.Writer, r *csisupdv1.ExternalSnapshotsResponse) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tEXTERNAL ID\tCLUSTER ID\tSOURCE\tSIZE\tREADY\tCONTROLLERS")
	for _, s := range r.GetSnapshots() {
		row(tw, s.GetState(), s.GetExternalId(), dash(s.GetClusterId()), dash(s.GetSourceExternalId()), formatBytes(s.GetSizeBytes()),
			fmt.Sprint(s.GetReadyToUse()), formatList(s.GetControllerNodeIds()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return printListingGaps(w, r.GetComplete(), r.GetTruncated(), r.GetErrors())
}
