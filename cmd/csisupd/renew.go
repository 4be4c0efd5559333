package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// errLostWorkloads is the error of a renewal that found workloads lost:
// the answer is printed, and the exit status is 1.
var errLostWorkloads = errors.New("workloads lost their claims")

func newVolumeRenewCommand(opts *clientOptions) *cobra.Command {
	var (
		node      string
		workloads []string
	)
	cmd := &cobra.Command{
		Use:   "renew --node NODE --workload W [--workload W2 ...]",
		Short: "Renew the leases of workloads' claims on a node",
		Long: `Renew the leases of every leased claim of the workloads on a node: each
gets its full lease from now. Renewals live in the leader's memory only;
a new leader gives every lease a full lease from when it took over.

It prints each renewed claim with its new deadline, and the workloads that
hold no claim on the node any more (lost: released, or their lease expired).
A workload whose claims on the node have no lease is neither renewed nor
lost. The exit status is 1 when any workload is lost, after the answer is
printed, so that a script holding the leases notices at once; with --json
the answer is protojson of RenewClaimsResponse.`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "node", "workload"); err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				nodeID, err := resolveNode(ctx, cl, node)
				if err != nil {
					return controlError(opts.address, err)
				}
				resp, err := cl.RenewClaims(ctx, &csisupdv1.RenewClaimsRequest{NodeId: nodeID, WorkloadIds: workloads})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					err = printProto(w, resp)
				} else {
					err = printRenewal(w, nodeID, resp)
				}
				if err != nil {
					return err
				}
				if lost := resp.GetLostWorkloadIds(); len(lost) > 0 {
					return fmt.Errorf("%w on node %s: %s", errLostWorkloads, display(nodeID), display(strings.Join(lost, ", ")))
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "node id or name the claims are on (required)")
	f.StringArrayVar(&workloads, "workload", nil, "id of a workload whose leases to renew (required); repeatable")
	return cmd
}

// printRenewal prints RenewClaims' answer.
func printRenewal(w io.Writer, nodeID string, r *csisupdv1.RenewClaimsResponse) error {
	if len(r.GetRenewed()) == 0 {
		fmt.Fprintf(w, "No lease renewed on node %s.\n", display(nodeID))
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VOLUME\tWORKLOAD\tLEASE\tDEADLINE")
		for _, c := range r.GetRenewed() {
			row(tw, c.GetVolumeId(), c.GetWorkloadId(), c.GetLeaseTtl().AsDuration().String(), formatTime(c.GetDeadline()))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, l := range r.GetLostWorkloadIds() {
		fmt.Fprintf(w, "Lost: workload %s holds no claim on node %s\n", display(l), display(nodeID))
	}
	return nil
}

// printClaimLeases prints, for the claims with an owner, a lease or a
// release reason, who holds them, their lease and its last renewal (the
// leader's; "-" in a stale read), and why they are being released.
func printClaimLeases(w io.Writer, claims []*csisupdv1.VolumeClaim, names nodeNames) error {
	var shown []*csisupdv1.VolumeClaim
	for _, c := range claims {
		if c.GetOwner() != "" || c.GetLeaseTtl() != nil || c.GetReleaseReason() != "" {
			shown = append(shown, c)
		}
	}
	if len(shown) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nOwners and leases")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tWORKLOAD\tOWNER\tLEASE\tLAST RENEWAL\tDEADLINE\tRELEASE REASON")
	for _, c := range shown {
		lease := "-"
		if c.GetLeaseTtl() != nil {
			lease = c.GetLeaseTtl().AsDuration().String()
		}
		row(tw, names.label(c.GetNodeId()), dash(c.GetWorkloadId()), dash(c.GetOwner()), lease, dash(formatTime(c.GetLeaseRenewedAt())),
			dash(formatTime(c.GetLeaseDeadline())), dash(c.GetReleaseReason()))
	}
	return tw.Flush()
}
