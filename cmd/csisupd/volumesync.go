package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
)

// maxWorkloadsFileBytes bounds a --workloads-from file: a node runs far
// fewer workloads than a list of this size holds.
const maxWorkloadsFileBytes = 4 << 20

func newVolumeSyncCommand(opts *clientOptions) *cobra.Command {
	var (
		node, owner, from string
		workloads         []string
		knownIndex        uint64
	)
	cmd := &cobra.Command{
		Use:   "sync --node NODE --owner O [--workload W ...] [--workloads-from FILE] [--known-index I]",
		Short: "Release the claims of an owner on a node whose workloads are not listed (a scheduler's sync)",
		Long: `Tell the servers which workloads of an owner (a scheduler) are alive on a
node. Every claim of that owner on the node whose workload is not listed
starts its release, with release_reason not_in_sync; the leader's volume
watcher runs the release steps, so follow them with "volume status" or
"events --cluster". Claims of other owners, or of none, are never touched,
and claims being released already are not listed again.

--known-index is the cluster index up to which the list is complete (the
index of "volume list --json", or a claim's claim_index): a claim taken
after it is kept, and listed as kept. Without it (0) every claim is kept:
give it to release anything.

--workload is repeatable; --workloads-from reads one workload id per line
from FILE ("-" is stdin), skipping blank lines and lines that start with
#. The lists add up; none at all says that no workload of the owner is
alive on the node.`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := requireFlags(cmd, "node", "owner"); err != nil {
				return err
			}
			if !ids.ValidPluginID(owner) {
				return usageError{fmt.Errorf("--owner %q: must match %s", owner, ids.PluginIDPattern)}
			}
			for _, w := range workloads {
				if !ids.ValidPathID(w) {
					return usageError{fmt.Errorf("--workload %q: must not be . or .., and must match %s", w, ids.PluginIDPattern)}
				}
			}
			if from != "" {
				listed, err := readWorkloadsFrom(from, cmd.InOrStdin())
				if err != nil {
					return usageError{err}
				}
				workloads = append(workloads, listed...)
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				nodeID, err := resolveNode(ctx, cl, node)
				if err != nil {
					return controlError(opts.address, err)
				}
				resp, err := cl.SyncNodeClaims(ctx, &csisupdv1.SyncNodeClaimsRequest{
					NodeId: nodeID, Owner: owner, WorkloadIds: workloads, KnownIndex: knownIndex,
				})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp)
				}
				return printSync(cmd.OutOrStdout(), resp)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "node id or name (required)")
	f.StringVar(&owner, "owner", "", "the owner (scheduler) whose claims are synced, as the claims name it (required)")
	f.StringArrayVar(&workloads, "workload", nil, "id of a workload of the owner alive on the node; repeatable")
	f.StringVar(&from, "workloads-from", "", `file with one live workload id per line ("-": stdin; blank lines and #comments skipped)`)
	f.Uint64Var(&knownIndex, "known-index", 0, "cluster index up to which the list is complete; claims taken after it are kept (0: keep every claim)")
	return cmd
}

// readWorkloadsFrom reads the workload ids of a --workloads-from file
// (name "-": stdin): one per line, blank lines and lines starting with #
// skipped, each line trimmed of surrounding spaces. A bad id is an error
// naming the file and the line.
func readWorkloadsFrom(name string, stdin io.Reader) ([]string, error) {
	r, label := stdin, "stdin"
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--workloads-from: %w", err)
		}
		defer f.Close()
		r, label = f, name
	}
	var out []string
	sc := bufio.NewScanner(io.LimitReader(r, maxWorkloadsFileBytes+1))
	read, line := 0, 0
	for sc.Scan() {
		line++
		if read += len(sc.Bytes()) + 1; read > maxWorkloadsFileBytes {
			return nil, fmt.Errorf("--workloads-from %s: larger than %d bytes", label, maxWorkloadsFileBytes)
		}
		w := strings.TrimSpace(sc.Text())
		if w == "" || strings.HasPrefix(w, "#") {
			continue
		}
		if !ids.ValidPathID(w) {
			return nil, fmt.Errorf("--workloads-from %s:%d: workload id %q must not be . or .., and must match %s", label, line, w, ids.PluginIDPattern)
		}
		out = append(out, w)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("--workloads-from %s:%d: line too long for a workload id", label, line+1)
		}
		return nil, fmt.Errorf("--workloads-from %s: %w", label, err)
	}
	return out, nil
}

// printSync prints the answer of a sync: the claims it released and
// those it kept because of the known index.
func printSync(w io.Writer, resp *csisupdv1.SyncNodeClaimsResponse) error {
	if len(resp.GetReleased())+len(resp.GetKeptByIndex()) == 0 {
		_, err := fmt.Fprintln(w, "In sync: no claim to release.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tWORKLOAD\tCLAIM INDEX\tACTION")
	for _, c := range resp.GetReleased() {
		row(tw, c.GetVolumeId(), c.GetWorkloadId(), fmt.Sprint(c.GetClaimIndex()), "releasing (not in sync)")
	}
	for _, c := range resp.GetKeptByIndex() {
		row(tw, c.GetVolumeId(), c.GetWorkloadId(), fmt.Sprint(c.GetClaimIndex()), "kept (taken after the known index)")
	}
	return tw.Flush()
}

func newVolumeCheckCommand(opts *clientOptions) *cobra.Command {
	var (
		nodes           []string
		accessMode      string
		readOnly, block bool
	)
	cmd := &cobra.Command{
		Use:   "check ID [--node NODE ...] [--access-mode M] [--read-only] [--block]",
		Short: "Show on which nodes a claim of a volume would be admitted now, and the rule that refuses it elsewhere",
		Long: `Show, for each node, whether a claim of the volume with this usage would
be admitted now (ok), or the rule that would refuse it (access mode,
capability, topology, max volumes, availability, node status, the plugin on
the node), with the same rules a claim meets. Nothing is written.

--node (a node id or name; repeatable) picks the nodes; without it every
node that runs the volume's plugin is checked. The usage defaults as a
claim's does: the volume's first capability.

Exit status: 0 when the check was answered, also when no node is ok: a
refusal is an answer (read the table, or "ok" in the JSON); 1 when the
check could not be made (an unknown volume, no leader); 2 for a usage
error.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			usage, err := checkUsage(accessMode, readOnly, block)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.CheckClaim(ctx, &csisupdv1.CheckClaimRequest{VolumeId: args[0], Usage: usage, NodeIds: nodes})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp)
				}
				return printCheck(cmd.OutOrStdout(), resp)
			})
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&nodes, "node", nil, "node id or name to check; repeatable (default: every node that runs the volume's plugin)")
	f.StringVar(&accessMode, "access-mode", "", "CSI access mode, e.g. single-node-writer, multi-node-reader-only (default: the volume's first capability)")
	f.BoolVar(&readOnly, "read-only", false, "check a claim for reading only")
	f.BoolVar(&block, "block", false, "check a claim of the volume as a block device")
	return cmd
}

// checkUsage returns the usage a volume check asks about, or nil for the
// volume's default.
func checkUsage(accessMode string, readOnly, block bool) (*csisupdv1.VolumeUsage, error) {
	if accessMode == "" && !readOnly && !block {
		return nil, nil
	}
	usage := &csisupdv1.VolumeUsage{ReadOnly: readOnly, AccessType: "mount"}
	if block {
		usage.AccessType = "block"
	}
	if accessMode != "" {
		mode, err := parseAccessMode(accessMode)
		if err != nil {
			return nil, err
		}
		usage.AccessMode = mode
	}
	return usage, nil
}

// printCheck prints CheckClaim's answer as a table.
func printCheck(w io.Writer, resp *csisupdv1.CheckClaimResponse) error {
	if len(resp.GetNodes()) == 0 {
		_, err := fmt.Fprintln(w, "No node runs the volume's plugin.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNODE ID\tRESULT\tREASON")
	for _, n := range resp.GetNodes() {
		result, reason := "ok", "-"
		if !n.GetOk() {
			result, reason = "refused", n.GetRule()+": "+n.GetMessage()
		}
		row(tw, dash(n.GetNodeName()), n.GetNodeId(), result, reason)
	}
	return tw.Flush()
}
