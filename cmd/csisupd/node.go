package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newNodeCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Inspect the nodes registered with the cluster",
		Args:  rangeArgs(0, 0),
	}
	var (
		stale      bool
		pageSize   uint32
		pluginID   string
		nodeStatus string
	)
	statusCmd := &cobra.Command{
		Use:   "status [NODE]",
		Short: "Show every node of the cluster, or one node with its plugins",
		Long: `Show every node of the cluster, or one node with its plugins.

A node is ready, down, or initializing. The leader reports a node recorded
ready as initializing until the node heartbeats to it: after a leader change
or a snapshot restore the record is what an earlier leader or the snapshot
saw. An initializing node's controllers are asked only after those of nodes
the leader has heard from, and a call its agent answers (a controller
call or a claim's mount) confirms it as a heartbeat does. With --stale a
follower answers from its own copy of the state and shows the recorded
status instead.`,
		Args: rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if len(args) == 0 {
					resp := &csisupdv1.NodeListResponse{}
					err := listAllPages(func(token string) (string, error) {
						page, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{
							Stale: stale, PageSize: pageSize, NextToken: token, PluginId: pluginID, Status: nodeStatus,
						})
						if err != nil {
							return "", controlError(opts.address, err)
						}
						resp.Nodes, resp.Index = append(resp.Nodes, page.GetNodes()...), page.GetIndex()
						return page.GetNextToken(), nil
					})
					if err != nil {
						return err
					}
					if opts.json {
						return printProto(w, resp)
					}
					return printNodeList(w, resp.GetNodes())
				}
				id, err := resolveNode(ctx, cl, args[0])
				if err != nil {
					return controlError(opts.address, err)
				}
				resp, err := cl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: id, Stale: stale})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(w, resp.GetNode())
				}
				return printNode(w, resp.GetNode())
			})
		},
	}
	statusCmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	pageFlag(statusCmd, &pageSize)
	statusCmd.Flags().StringVar(&pluginID, "plugin", "", "only nodes running this plugin")
	statusCmd.Flags().StringVar(&nodeStatus, "status", "", "only nodes in this status (ready, initializing, down)")
	cmd.AddCommand(statusCmd, newNodeRekeyCommand(opts))
	return cmd
}

func newNodeRekeyCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "rekey NODE",
		Short: "Clear the node secret the servers hold for a node, so that a reinstalled agent can register",
		Long: `Clear the node secret the servers hold for a node (by id or name).

Every agent makes a random node secret at its first start, keeps it in
data_dir/node-secret, and presents it on every call to the servers, which
keep only its hash and refuse a call for the node with another secret. An
agent reinstalled with an empty data_dir has a new secret (and a new node
id), so the servers refuse it until an operator rekeys the node:

- the next agent that registers with the node's id sets the new secret;
- an agent that registers with another id and the node's name takes the
  name: the old node is marked replaced and down, and its claims are
  released without it after claim_gc_grace, as for any node that is gone.

Needs operator:write. Rekey only a node whose agent you reinstalled: until
an agent registers, whoever registers first as the node becomes it.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				id, err := resolveNode(ctx, cl, args[0])
				if err != nil {
					return controlError(opts.address, err)
				}
				resp, err := cl.RekeyNode(ctx, &csisupdv1.NodeRekeyRequest{Id: id})
				if err != nil {
					return controlError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp.GetNode())
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "Rekeyed node %s (%s): the next agent to register as it sets its secret\n",
					display(id), display(dash(resp.GetNode().GetName())))
				return err
			})
		},
	}
}

func nodePluginIDs(n *csisupdv1.ClusterNode) string {
	var ids []string
	for _, p := range n.GetPlugins() {
		ids = append(ids, display(p.GetId()))
	}
	if len(ids) == 0 {
		return "-"
	}
	return strings.Join(ids, ",")
}

func printNodeList(w io.Writer, nodes []*csisupdv1.ClusterNode) error {
	if len(nodes) == 0 {
		_, err := fmt.Fprintln(w, "No nodes registered.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tADDRESS\tSTATUS\tPLUGINS")
	for _, n := range nodes {
		row(tw, n.GetId(), dash(n.GetName()), dash(n.GetAddress()), n.GetStatus(), nodePluginIDs(n))
	}
	return tw.Flush()
}

func printNode(w io.Writer, n *csisupdv1.ClusterNode) error {
	fmt.Fprintf(w, "ID:         %s\n", display(n.GetId()))
	fmt.Fprintf(w, "Name:       %s\n", display(dash(n.GetName())))
	fmt.Fprintf(w, "Address:    %s\n", display(dash(n.GetAddress())))
	fmt.Fprintf(w, "Status:     %s\n", display(n.GetStatus()))
	if d := n.GetStatusDescription(); d != "" {
		fmt.Fprintf(w, "            %s\n", display(d))
	}
	fmt.Fprintf(w, "Registered: %s\n", dash(formatTime(n.GetRegisteredAt())))
	switch {
	case n.GetReplacedBy() != "":
		fmt.Fprintf(w, "Replaced:   by node %s, after a rekey\n", display(n.GetReplacedBy()))
	case n.GetRekeyed():
		fmt.Fprintln(w, "Rekeyed:    the next agent to register as this node sets its secret")
	}
	if len(n.GetPlugins()) == 0 {
		_, err := fmt.Fprintln(w, "\nNo plugins.")
		return err
	}
	fmt.Fprintln(w, "\nPlugins")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tHEALTH\tVENDOR\tVERSION\tCSI NODE ID\tDESCRIPTION")
	for _, p := range n.GetPlugins() {
		row(tw, p.GetId(), dash(p.GetType()), dash(p.GetHealthState()),
			dash(p.GetVendorName()), dash(p.GetVendorVersion()), dash(p.GetNodeId()), dash(p.GetHealthDescription()))
	}
	return tw.Flush()
}
