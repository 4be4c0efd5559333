package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// withControl calls fn with a Control client (see withClient).
func (o *clientOptions) withControl(parent context.Context, fn func(context.Context, csisupdv1.ControlClient) error) error {
	return withClient(o, parent, csisupdv1.NewControlClient, fn)
}

// withClient dials the agent named by the global flags and calls fn with
// the client newClient makes on the connection and a context bounded by
// --timeout. Errors of fn are returned as they are; wrap RPC errors with
// controlError.
func withClient[C any](o *clientOptions, parent context.Context, newClient func(grpc.ClientConnInterface) C, fn func(context.Context, C) error) error {
	conn, err := o.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := o.requestContext(parent)
	defer cancel()
	return fn(ctx, newClient(conn))
}

// controlError makes a Control API failure readable: an agent without the
// server role is named as such, everything else as answerError does, with
// the server as the side that answered.
func controlError(addr string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unimplemented &&
		strings.Contains(st.Message(), "unknown service") {
		return fmt.Errorf("the agent at %s is not a server; point --address at a server", addr)
	}
	return answerError("server", addr, err)
}

func newPluginCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Inspect the plugins known to the cluster, or print what a plugin needs beside this agent",
		Args:  rangeArgs(0, 0),
	}
	var (
		stale    bool
		pageSize uint32
		capacity bool
	)
	statusCmd := &cobra.Command{
		Use:   "status [ID]",
		Short: "Show every plugin of the cluster, or one plugin with its instances per node",
		Args:  rangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				if len(args) == 0 {
					resp := &csisupdv1.PluginListResponse{}
					err := listAllPages(func(token string) (string, error) {
						page, err := cl.ListPlugins(ctx, &csisupdv1.PluginListRequest{Stale: stale, PageSize: pageSize, NextToken: token})
						if err != nil {
							return "", controlError(opts.address, err)
						}
						resp.Plugins, resp.Index = append(resp.Plugins, page.GetPlugins()...), page.GetIndex()
						return page.GetNextToken(), nil
					})
					if err != nil {
						return err
					}
					if opts.json {
						return printProto(w, resp)
					}
					return printPluginList(w, resp.GetPlugins())
				}
				resp, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: args[0], Stale: stale})
				if err != nil {
					return controlError(opts.address, err)
				}
				var capacities *csisupdv1.PluginCapacityResponse
				if capacity {
					if capacities, err = cl.GetPluginCapacity(ctx, &csisupdv1.PluginCapacityRequest{PluginId: args[0]}); err != nil {
						return controlError(opts.address, err)
					}
				}
				if opts.json {
					if capacity {
						return printProto(w, capacities)
					}
					return printProto(w, resp.GetPlugin())
				}
				if err := printPlugin(w, resp.GetPlugin()); err != nil || !capacity {
					return err
				}
				return printCapacities(w, capacities.GetCapacities())
			})
		},
	}
	statusCmd.Flags().BoolVar(&stale, "stale", false, "let any server answer from its local state, without asking the leader")
	statusCmd.Flags().BoolVar(&capacity, "capacity", false, "with ID: ask the plugin's capacity (GetCapacity) in each topology segment of its controllers; "+
		"with --json, print the capacities")
	pageFlag(statusCmd, &pageSize)
	cmd.AddCommand(statusCmd, newPluginMountsCommand(opts), newPluginDrainCommand(opts))
	return cmd
}

func printPluginList(w io.Writer, plugins []*csisupdv1.ClusterPlugin) error {
	if len(plugins) == 0 {
		_, err := fmt.Fprintln(w, "No plugins registered.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROVIDER\tVERSION\tCONTROLLERS HEALTHY/EXPECTED\tNODES HEALTHY/EXPECTED")
	for _, p := range plugins {
		row(tw, p.GetId(), dash(p.GetProvider()), dash(p.GetVersion()),
			fmt.Sprintf("%d/%d", p.GetControllersHealthy(), p.GetControllersExpected()),
			fmt.Sprintf("%d/%d", p.GetNodesHealthy(), p.GetNodesExpected()))
	}
	return tw.Flush()
}

func printPlugin(w io.Writer, p *csisupdv1.ClusterPlugin) error {
	fmt.Fprintf(w, "ID:          %s\n", display(p.GetId()))
	fmt.Fprintf(w, "Provider:    %s\n", display(dash(p.GetProvider())))
	fmt.Fprintf(w, "Version:     %s\n", display(dash(p.GetVersion())))
	fmt.Fprintf(w, "Controllers: %d healthy / %d expected\n", p.GetControllersHealthy(), p.GetControllersExpected())
	fmt.Fprintf(w, "Nodes:       %d healthy / %d expected\n", p.GetNodesHealthy(), p.GetNodesExpected())
	if len(p.GetDrainingNodes()) > 0 {
		names := nodeNames{}
		for _, in := range p.GetInstances() {
			names[in.GetNodeId()] = in.GetNodeName()
		}
		fmt.Fprintf(w, "Draining on: %s\n", display(strings.Join(names.labels(p.GetDrainingNodes()), ", ")))
	}
	if len(p.GetInstances()) == 0 {
		_, err := fmt.Fprintln(w, "\nNo instances.")
		return err
	}
	fmt.Fprintln(w, "\nInstances")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNAME\tTYPE\tHEALTHY\tDESCRIPTION")
	for _, in := range p.GetInstances() {
		row(tw, in.GetNodeId(), dash(in.GetNodeName()), dash(in.GetPlugin().GetType()),
			fmt.Sprint(in.GetHealthy()), dash(in.GetHealthDescription()))
	}
	return tw.Flush()
}

// printCapacities prints a plugin's capacity per topology segment.
func printCapacities(w io.Writer, caps []*csisupdv1.PluginCapacity) error {
	fmt.Fprintln(w, "\nCapacity")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEGMENT\tCONTROLLER\tAVAILABLE\tMAX VOLUME\tMIN VOLUME\tERROR")
	for _, c := range caps {
		available := formatBytes(c.GetAvailableBytes())
		if c.GetError() == "" && c.GetAvailableBytes() == 0 {
			available = "0 B" // full, not unknown
		}
		row(tw, formatSegments([]*csisupdv1.TopologySegment{c.GetSegment()}), dash(c.GetControllerNodeId()), available,
			formatBytes(c.GetMaximumVolumeBytes()), formatBytes(c.GetMinimumVolumeBytes()), dash(c.GetError()))
	}
	return tw.Flush()
}
