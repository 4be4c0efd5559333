package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// drainPollInterval is how often `plugin drain --wait` asks again.
const drainPollInterval = time.Second

func newPluginDrainCommand(opts *clientOptions) *cobra.Command {
	var (
		node        string
		wait        bool
		waitTimeout time.Duration
		cancel      bool
	)
	cmd := &cobra.Command{
		Use:   "drain ID --node NODE [--wait] [--cancel]",
		Short: "Refuse new claims of a plugin's volumes on a node, and wait until the node holds none",
		Long: `Refuse new claims of a plugin's volumes on a node (rule "availability"), so
that the plugin can be upgraded or removed there safely. The claims it has
stay until their workloads release them (or "volume release --force").

--wait returns once no claim of the plugin's volumes is left on the node and
the node's agent reports no mount of the plugin (nothing staged or
published), or fails after --wait-timeout. --cancel ends the drain.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "node"); err != nil {
				return err
			}
			if cancel && wait {
				return usageError{errors.New("--wait and --cancel exclude each other")}
			}
			if waitTimeout <= 0 {
				return usageError{fmt.Errorf("--wait-timeout %s: want a positive duration", waitTimeout)}
			}
			w := cmd.OutOrStdout()
			// The client is dialled here rather than through withControl:
			// --timeout bounds each call, and --wait-timeout the wait.
			conn, err := opts.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			cl := csisupdv1.NewControlClient(conn)
			nodeID, resp, err := startDrain(cmd.Context(), opts, cl, args[0], node, cancel)
			if err != nil {
				return err
			}
			if wait {
				// Ctrl-C ends the wait, not the drain: say so, and how
				// to end it.
				waitCtx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				if resp, err = waitDrained(waitCtx, opts, cl, args[0], nodeID, waitTimeout, resp, w); err != nil {
					if errors.Is(waitCtx.Err(), context.Canceled) {
						return drainInterrupted(args[0], node)
					}
					return err
				}
			}
			if opts.json {
				return printProto(w, resp)
			}
			return printDrain(w, args[0], nodeID, resp)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "node id or name (required)")
	cmd.Flags().BoolVar(&wait, "wait", false, "return only once the node holds no claim and no mount of the plugin")
	cmd.Flags().DurationVar(&waitTimeout, "wait-timeout", 30*time.Minute, "how long --wait waits")
	cmd.Flags().BoolVar(&cancel, "cancel", false, "end the drain: the node takes new claims of the plugin's volumes again")
	return cmd
}

// drainInterrupted is the error of a `plugin drain --wait` interrupted
// before the node was drained: the drain stays in force.
func drainInterrupted(plugin, node string) error {
	return fmt.Errorf("interrupted: stopped waiting, but the drain of plugin %s on node %s stays in force "+
		"(the node refuses new claims of its volumes); end it with `csisupd plugin drain %s --node %s --cancel`",
		display(plugin), display(node), display(plugin), display(node))
}

// drained reports whether a drain left nothing on its node.
func drained(r *csisupdv1.PluginDrainResponse) bool {
	return len(r.GetClaims()) == 0 && len(r.GetMounts()) == 0 && r.GetMountsError() == ""
}

// startDrain resolves node and starts (or with cancel ends) the drain of
// plugin there, within one --timeout.
func startDrain(parent context.Context, opts *clientOptions, cl csisupdv1.ControlClient, plugin, node string, cancel bool,
) (string, *csisupdv1.PluginDrainResponse, error) {
	ctx, done := opts.requestContext(parent)
	defer done()
	nodeID, err := resolveNode(ctx, cl, node)
	if err != nil {
		return "", nil, controlError(opts.address, err)
	}
	resp, err := cl.DrainPlugin(ctx, &csisupdv1.PluginDrainRequest{PluginId: plugin, NodeId: nodeID, Cancel: cancel})
	if err != nil {
		return "", nil, controlError(opts.address, err)
	}
	return nodeID, resp, nil
}

// waitDrained asks for the drain of plugin on node every
// drainPollInterval, each call within --timeout, until nothing is left
// there or timeout passes, printing (in text mode) what is left whenever
// it changes.
func waitDrained(ctx context.Context, opts *clientOptions, cl csisupdv1.ControlClient, plugin, node string, timeout time.Duration,
	resp *csisupdv1.PluginDrainResponse, w io.Writer,
) (*csisupdv1.PluginDrainResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	notDrained := func() error {
		return fmt.Errorf("plugin %s on node %s is not drained after %s: %s", plugin, node, timeout, leftSummary(resp))
	}
	for !drained(resp) {
		if now := leftSummary(resp); !opts.json && now != last {
			fmt.Fprintf(w, "Waiting: %s\n", now)
			last = now
		}
		t := time.NewTimer(drainPollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, notDrained()
		case <-t.C:
		}
		callCtx, done := opts.requestContext(ctx)
		next, err := cl.GetPluginDrain(callCtx, &csisupdv1.PluginDrainGetRequest{PluginId: plugin, NodeId: node})
		done()
		if err != nil {
			if ctx.Err() != nil {
				return nil, notDrained()
			}
			return nil, controlError(opts.address, err)
		}
		resp = next
	}
	return resp, nil
}

// leftSummary says what a drain has left on its node.
func leftSummary(r *csisupdv1.PluginDrainResponse) string {
	s := fmt.Sprintf("%d claims, %d mounts left", len(r.GetClaims()), len(r.GetMounts()))
	if r.GetMountsError() != "" {
		s += "; the node's mounts could not be read: " + r.GetMountsError()
	}
	return s
}

func printDrain(w io.Writer, plugin, node string, r *csisupdv1.PluginDrainResponse) error {
	state := "drains"
	if !r.GetDraining() {
		state = "does not drain"
	}
	fmt.Fprintf(w, "Plugin %s %s on node %s: %s\n", display(plugin), state, display(node), display(leftSummary(r)))
	for _, c := range r.GetClaims() {
		fmt.Fprintf(w, "  claim  volume %s  workload %s  %s\n", display(c.GetVolumeId()), display(c.GetWorkloadId()), display(c.GetState()))
	}
	for _, m := range r.GetMounts() {
		fmt.Fprintf(w, "  mount  volume %s  workload %s  %s  %s\n", display(m.GetVolumeId()), display(m.GetWorkloadId()), display(m.GetState()), display(m.GetHostPath()))
	}
	return nil
}
