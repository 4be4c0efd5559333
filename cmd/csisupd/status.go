package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newStatusCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the agent and the plugins it supervises",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withClient(opts, cmd.Context(), csisupdv1.NewAgentClient, func(ctx context.Context, cl csisupdv1.AgentClient) error {
				resp, err := cl.Status(ctx, &csisupdv1.StatusRequest{})
				if err != nil {
					return agentError(opts.address, err)
				}
				if opts.json {
					return printProto(cmd.OutOrStdout(), resp)
				}
				return printStatus(cmd.OutOrStdout(), resp)
			})
		},
	}
}

// agentError makes a failure of a call to the Agent service (or another
// service an agent serves itself) readable, naming the agent as the side
// that answered; see answerError.
func agentError(addr string, err error) error { return answerError("agent", addr, err) }

// answerError makes an RPC failure say what went wrong and which side
// answered: side is "agent" for the services an agent serves itself and
// "server" for the Control API, which servers serve, with the leader that
// ran the call when the server named it. It says that the
// agent at addr could not be reached (the connection failed: no side
// answered), the cluster has no leader (none elected, or the leader was
// lost during the call: safe to retry), a node's agent is down, the plugin
// is not known to the cluster (yet), or the token does not allow the call.
// Each is told by the error's typed detail or by the connection, never by
// its text. The message is the server's, escaped like any outside string.
func answerError(side, addr string, err error) error {
	st := status.Convert(err)
	msg := display(st.Message())
	if pnf, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginNotFound](err); ok && pnf.GetNode() == "" {
		return fmt.Errorf("plugin %s is not known to the cluster yet: no node has registered it (`csisupd plugin status` lists the plugins the cluster knows)",
			display(pnf.GetPluginId()))
	}
	if nu, ok := csisupdv1.ErrorDetail[*csisupdv1.NodeUnreachable](err); ok {
		return fmt.Errorf("node %s is unreachable: the servers cannot reach its agent at %s (is `csisupd agent` running there?); "+
			"they finish a release by themselves once it is back, and `csisupd volume status` shows where it stands: %s",
			display(nu.GetNodeId()), display(nu.GetAddress()), msg)
	}
	who := side + " " + display(addr)
	if leader, ok := csisupdv1.AnsweringLeader(err); ok {
		// The server forwarded the call to the leader, or is the leader.
		who += " (leader " + display(leader) + ")"
	}
	switch {
	case csisupdv1.NotReached(err):
		return fmt.Errorf("cannot reach the agent at %s (is `csisupd agent` running? set --address or CSISUPD_ADDR): %s", display(addr), msg)
	case csisupdv1.IsNoLeader(err):
		return fmt.Errorf("the cluster has no leader (%s): the servers may be electing one; the call is safe to retry (see `csisupd operator raft list-peers`)", msg)
	case st.Code() == codes.PermissionDenied:
		return fmt.Errorf("permission denied by %s: %s (pass a token that allows it: --token, %s or %s)", who, msg, EnvToken, EnvTokenFile)
	case st.Code() == codes.Unauthenticated:
		return fmt.Errorf("%s does not accept the credentials: %s", who, msg)
	case st.Code() == codes.Unavailable && csisupdv1.IsRetryable(err):
		// The side answered: the condition is temporary, and the message
		// says what it waits for.
		return fmt.Errorf("%s: %s (temporary; try again)", who, msg)
	case st.Code() == codes.Unavailable:
		// The side answered, or its connection broke during the call.
		return fmt.Errorf("%s is unavailable: %s", who, msg)
	}
	return fmt.Errorf("%s: %s", who, msg)
}

func printStatus(w io.Writer, r *csisupdv1.StatusResponse) error {
	healthy := 0
	for _, p := range r.GetPlugins() {
		if p.GetHealthy() {
			healthy++
		}
	}
	fmt.Fprintf(w, "Agent:      %s (csisupd %s)\n", display(r.GetName()), display(r.GetVersion()))
	if st := r.GetStartedAt(); st != nil {
		fmt.Fprintf(w, "Up:         %s\n", time.Since(st.AsTime()).Round(time.Second))
	}
	fmt.Fprintf(w, "Plugin dir: %s\n", display(r.GetPluginDir()))
	printCluster(w, r.GetCluster(), r.GetName())
	fmt.Fprintf(w, "Plugins:    %d (%d healthy)\n", len(r.GetPlugins()), healthy)
	if len(r.GetPlugins()) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTYPE\tHEALTH\tVENDOR\tVERSION\tNODE ID\tLAST PROBE\tDESCRIPTION")
		for _, p := range r.GetPlugins() {
			row(tw, p.GetId(), p.GetType(), p.GetHealthState(),
				dash(p.GetVendorName()), dash(p.GetVendorVersion()), dash(p.GetNodeId()),
				ago(p.GetLastProbe()), p.GetHealthDescription())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.GetMounts()) > 0 {
		fmt.Fprintln(w, "\nMounts")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PLUGIN\tVOLUME\tWORKLOAD\tUSAGE\tSTATE\tHOST PATH")
		for _, m := range r.GetMounts() {
			row(tw, m.GetPluginId(), m.GetVolumeId(), m.GetWorkloadId(), m.GetUsageKey(), m.GetState(), m.GetHostPath())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.GetIgnored()) > 0 {
		fmt.Fprintln(w, "\nIgnored plugin sockets (plugin directory, declared sockets, kubelet registrations):")
		ignored := append([]*csisupdv1.IgnoredEntry(nil), r.GetIgnored()...)
		sort.Slice(ignored, func(i, j int) bool { return ignored[i].GetPath() < ignored[j].GetPath() })
		for _, ig := range ignored {
			fmt.Fprintf(w, "  %s: %s\n", display(ig.GetPath()), display(ig.GetReason()))
		}
	}
	return nil
}

// printCluster prints the cluster lines of `status`, when the agent has a
// place in a cluster; name is the agent's node name.
func printCluster(w io.Writer, c *csisupdv1.ClusterSummary, name string) {
	if c == nil || (!c.GetServer() && len(c.GetServers()) == 0) {
		return
	}
	registered := "not registered"
	if c.GetNodeRegistered() {
		registered = "registered"
	}
	if len(c.GetServers()) > 0 {
		servers := make([]string, len(c.GetServers()))
		for i, s := range c.GetServers() {
			servers[i] = display(s)
		}
		fmt.Fprintf(w, "Node:       %s, %s with %s\n", display(nodeNames{c.GetNodeId(): name}.label(c.GetNodeId())), registered, strings.Join(servers, ", "))
	}
	if c.GetServer() {
		fmt.Fprintf(w, "Cluster:    leader %s, %d raft peers, %d of %d nodes ready\n",
			display(dash(c.GetLeader())), c.GetRaftPeers(), c.GetNodesReady(), c.GetNodes())
	}
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func ago(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "never"
	}
	d := time.Since(ts.AsTime())
	if d < time.Second {
		return "just now"
	}
	return d.Round(time.Second).String() + " ago"
}

func dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
