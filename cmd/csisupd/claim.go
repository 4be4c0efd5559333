package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// The bounds of a claim's lease, as the servers check them: checked here
// too, so that a typo is a usage error before anything is sent.
const (
	minLease = 5 * time.Second
	maxLease = 24 * time.Hour
)

func newVolumeClaimCommand(opts *clientOptions) *cobra.Command {
	var (
		node, workload, accessMode, fsType string
		mountGroup, owner                  string
		readOnly, block                    bool
		mountFlags, secrets                []string
		lease                              time.Duration
		createFrom                         string
		ephemeral                          bool
	)
	cmd := &cobra.Command{
		Use:   "claim ID --node NODE --workload W",
		Short: "Claim a volume for a workload on a node: publish, stage and mount it there",
		Long: `Claim a volume for a workload on a node. The servers check the access mode
against the volume's other claims, the volume's topology and the node's volume
limit, publish the volume to the node through a controller, and have the
node's agent stage and publish it. The claim's host path is where the workload
finds the volume.

--mount-group GID asks the plugin to make the volume's files accessible to
that group id (CSI volume_mount_group), for workloads that run as a group
other than the file owner's. Only plugins with the VOLUME_MOUNT_GROUP node
capability take it: the servers refuse the claim on a node whose plugin
lacks it.

--lease D gives the claim a lease (a Go duration, 5s to 24h): unless
"volume renew" renews it within D, the servers release it (release reason
lease_expired). --owner O names the scheduler that holds the claim.

--create-from SPEC.hcl creates the volume first when it does not exist, from
the volume specification file that volume create -f reads, on the claiming
node's topology of the plugin (a node-local driver creates it on that node);
an existing volume is claimed as it is. The file's id or name, when set, must
be the claimed volume's. --ephemeral, only with --create-from, deletes the
volume when its last claim is released.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "node", "workload"); err != nil {
				return err
			}
			var leaseTTL *durationpb.Duration
			if cmd.Flags().Changed("lease") {
				if lease < minLease || lease > maxLease {
					return usageError{fmt.Errorf("--lease %s is out of range: give %s to %s", lease, minLease, maxLease)}
				}
				leaseTTL = durationpb.New(lease)
			}
			usage := &csisupdv1.VolumeUsage{ReadOnly: readOnly, AccessType: "mount", FsType: fsType, MountFlags: mountFlags,
				VolumeMountGroup: mountGroup}
			if block {
				if fsType != "" || len(mountFlags) > 0 || mountGroup != "" {
					return usageError{fmt.Errorf("--fs-type, --mount-flag and --mount-group do not apply to --block")}
				}
				usage.AccessType = "block"
			}
			if accessMode != "" {
				mode, err := parseAccessMode(accessMode)
				if err != nil {
					return err
				}
				usage.AccessMode = mode
			}
			sec, err := parseKeyValues("secret", secrets)
			if err != nil {
				return err
			}
			if ephemeral && createFrom == "" {
				return usageError{fmt.Errorf("--ephemeral needs --create-from: only a volume its claim creates is deleted at its last release")}
			}
			var create *csisupdv1.VolumeCreateRequest
			if createFrom != "" {
				if create, err = claimCreateRequest(createFrom, args[0], cmd.InOrStdin()); err != nil {
					return err
				}
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				nodeID, err := resolveNode(ctx, cl, node)
				if err != nil {
					return controlError(opts.address, err)
				}
				resp, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{
					Id: args[0], NodeId: nodeID, WorkloadId: workload, Usage: usage, Secrets: sec,
					LeaseTtl: leaseTTL, Owner: owner,
					Create: create, Ephemeral: ephemeral,
				})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp.GetClaim())
				}
				return printClaim(w, resp.GetVolume(), resp.GetClaim(), nodeNames{nodeID: node})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "node id or name to claim the volume on (required)")
	f.StringVar(&workload, "workload", "", "id of the workload that uses the volume (required)")
	f.BoolVar(&readOnly, "read-only", false, "claim for reading only")
	f.StringVar(&accessMode, "access-mode", "", "CSI access mode, e.g. single-node-writer, multi-node-reader-only (default: the volume's first capability)")
	f.BoolVar(&block, "block", false, "use the volume as a block device rather than a file system")
	f.StringVar(&fsType, "fs-type", "", "file system type to mount, e.g. ext4")
	f.StringArrayVar(&mountFlags, "mount-flag", nil, "mount flag; repeatable")
	f.StringVar(&mountGroup, "mount-group", "", "group id (decimal GID) the plugin makes the volume accessible to (CSI volume_mount_group; needs the plugin's VOLUME_MOUNT_GROUP node capability)")
	f.StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	f.DurationVar(&lease, "lease", 0, "lease of the claim, 5s to 24h: released unless renewed (volume renew) within it")
	f.StringVar(&owner, "owner", "", "name of the scheduler that holds the claim, e.g. nomad")
	f.StringVar(&createFrom, "create-from", "", "volume specification file (as volume create -f reads; - reads standard input) to create the volume from when it does not exist")
	f.BoolVar(&ephemeral, "ephemeral", false, "with --create-from: delete the volume when its last claim is released")
	return cmd
}

func newVolumeReleaseCommand(opts *clientOptions) *cobra.Command {
	var (
		node, workload string
		secrets        []string
		force          int
	)
	cmd := &cobra.Command{
		Use:   "release ID --node NODE --workload W [--force [--force]]",
		Short: "Release a workload's claim: unpublish and unstage on the node, then unpublish in the controller",
		Long: `Release a workload's claim: unpublish and unstage on the node, then unpublish in the controller.

--force releases the claims of a node that is down or gone for good without
it: the controller unpublishes, the claims are freed, and the node's agent
cleans up when it comes back. Without --workload it releases every claim of
the volume on the node. It is refused for a node that is up.

--force --force also releases on a node that is up and answering, skipping
each step that fails; the skipped steps are recorded on the claim and raise
a volume-claim-forced event. What a skipped step left (a mount, a
publication) stays on the node or in the storage until someone removes it.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			required := []string{"node", "workload"}
			if force > 0 {
				required = required[:1]
			}
			if err := requireFlags(cmd, required...); err != nil {
				return err
			}
			if force > 2 {
				return usageError{fmt.Errorf("--force is given once (a node that is down or gone) or twice (also a node that answers), not %d times", force)}
			}
			return releaseClaims(cmd, opts, args[0], node, workload, secrets, uint32(force))
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node id or name of the claim (required)")
	cmd.Flags().StringVar(&workload, "workload", "", "workload id of the claim (required without --force)")
	cmd.Flags().CountVar(&force, "force", "release without a node that is down or gone; twice: also on a node that answers, skipping failed steps (needs operator:write with ACLs)")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

func newVolumeDetachCommand(opts *clientOptions) *cobra.Command {
	var (
		node    string
		secrets []string
	)
	cmd := &cobra.Command{
		Use:   "detach ID --node NODE",
		Short: "Release every claim of a volume on a node",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "node"); err != nil {
				return err
			}
			return releaseClaims(cmd, opts, args[0], node, "", secrets, 0)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node id or name (required)")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

// releaseClaims releases the claims of workload (every claim when empty)
// of volume id on node, and prints the volume.
func releaseClaims(cmd *cobra.Command, opts *clientOptions, id, node, workload string, secrets []string, force uint32) error {
	sec, err := parseKeyValues("secret", secrets)
	if err != nil {
		return err
	}
	return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
		nodeID, err := resolveNode(ctx, cl, node)
		if err != nil {
			return controlError(opts.address, err)
		}
		resp, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: id, NodeId: nodeID, WorkloadId: workload, Secrets: sec, Force: force})
		if err != nil {
			return controlError(opts.address, err)
		}
		if opts.json {
			return printProto(cmd.OutOrStdout(), resp.GetVolume())
		}
		if resp.GetReleased() == 0 {
			what := "no claim"
			if workload != "" {
				what = fmt.Sprintf("no claim of workload %s", display(workload))
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "Nothing to release: volume %s has %s on node %s\n", display(id), what,
				display(nodeNames{nodeID: node}.label(nodeID)))
			return err
		}
		if err := printVolumeResult(cmd.OutOrStdout(), false, fmt.Sprintf("Released %d claim(s) of", resp.GetReleased()), resp.GetVolume()); err != nil {
			return err
		}
		if v := resp.GetVolume(); v.GetEphemeral() && len(v.GetClaims()) == 0 {
			// The servers deleted it, or their volume watcher will once
			// the plugin's delete succeeds.
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "Volume %s is ephemeral: its last claim is released, so it is deleted\n", display(v.GetId()))
			return err
		}
		return nil
	})
}

// printClaim prints the claim ClaimVolume returned, its node with the
// name names knows.
func printClaim(w io.Writer, v *csisupdv1.Volume, c *csisupdv1.VolumeClaim, names nodeNames) error {
	_, err := fmt.Fprintf(w, "Claimed volume %s for workload %s on node %s (%s, %s)\nHost path: %s\n",
		display(v.GetId()), display(c.GetWorkloadId()), display(names.label(c.GetNodeId())), display(c.GetState()),
		display(accessModeName(c.GetUsage().GetAccessMode())), display(dash(c.GetHostPath())))
	return err
}
