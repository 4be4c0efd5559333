package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newEventsCommand(opts *clientOptions) *cobra.Command {
	var (
		replay    int32
		pluginID  string
		fromIndex uint64
		cluster   bool
		volumeID  string
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the agent's plugin events, or with --cluster the cluster's: buffered ones first, then new ones as they happen",
		Long: "Print the agent's plugin events: buffered ones first, then new ones as they happen.\n\n" +
			"With --cluster, print the cluster's events instead (a server's Control.WatchEvents: nodes,\n" +
			"plugins, volumes, claims, health), for example to follow a volume drain's releases:\n" +
			"csisupd events --cluster --volume VOL.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if volumeID != "" && !cluster {
				return usageError{errors.New("--volume needs --cluster: an agent's plugin events filter by --plugin")}
			}
			if cluster {
				if replay > 0 {
					return usageError{errors.New("--replay N counts an agent's buffered events; with --cluster use --index N, or --replay -1 for none")}
				}
				req := &csisupdv1.ClusterEventWatchRequest{FromIndex: fromIndex, NoReplay: replay < 0}
				return watchClusterEvents(cmd, opts, req, clusterEventFilter{plugin: pluginID, volume: volumeID})
			}
			conn, err := opts.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			req := &csisupdv1.WatchEventsRequest{Replay: replay, PluginId: pluginID}
			if cmd.Flags().Changed("index") {
				req.FromIndex = &fromIndex
			}
			stream, err := csisupdv1.NewAgentClient(conn).WatchEvents(cmd.Context(), req)
			if err != nil {
				return agentError(opts.address, err)
			}
			w := cmd.OutOrStdout()
			return printStream(stream.Recv, func(err error) error { return eventsError(opts.address, err) },
				func(e *csisupdv1.Event) error { return printEvent(w, e, opts.json) })
		},
	}
	cmd.Flags().Int32Var(&replay, "replay", 0, "buffered events to print first: 0 all, -1 none")
	cmd.Flags().StringVar(&pluginID, "plugin", "", "only events of this plugin id")
	cmd.Flags().Uint64Var(&fromIndex, "index", 0, "start after the event with this index (instead of --replay): continues a stream that fell behind")
	cmd.Flags().BoolVar(&cluster, "cluster", false, "the cluster's events, from a server (--replay 0 all buffered, -1 none; --index N after raft index N)")
	cmd.Flags().StringVar(&volumeID, "volume", "", "with --cluster: only events of this volume id")
	return cmd
}

// clusterEventFilter keeps the cluster events of one plugin and one
// volume, when set.
type clusterEventFilter struct{ plugin, volume string }

func (f clusterEventFilter) keep(e *csisupdv1.ClusterEvent) bool {
	return (f.plugin == "" || e.GetPluginId() == f.plugin) && (f.volume == "" || e.GetVolumeId() == f.volume)
}

// watchClusterEvents follows a server's cluster events until the stream
// or the command ends.
func watchClusterEvents(cmd *cobra.Command, opts *clientOptions, req *csisupdv1.ClusterEventWatchRequest, f clusterEventFilter) error {
	conn, err := opts.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	cl := csisupdv1.NewControlClient(conn)
	stream, err := cl.WatchEvents(cmd.Context(), req)
	if err != nil {
		return controlError(opts.address, err)
	}
	// The nodes' names, as the stream starts: a node that registers
	// later prints with its id alone.
	var names nodeNames
	if !opts.json {
		ctx, done := opts.requestContext(cmd.Context())
		names = listNodeNames(ctx, cl, false)
		done()
	}
	w := cmd.OutOrStdout()
	return printStream(stream.Recv, func(err error) error { return controlError(opts.address, err) },
		func(e *csisupdv1.ClusterEvent) error {
			switch {
			case !f.keep(e):
				return nil
			case opts.json:
				return printProtoLine(w, e)
			}
			_, err := fmt.Fprintf(w, "%s  %-8d %-24s %-20s %-20s %s\n", formatTime(e.GetTime()), e.GetIndex(),
				display(e.GetType()), dash(display(e.GetVolumeId())), dash(display(names.label(e.GetNodeId()))), dash(display(e.GetDescription())))
			return err
		})
}

// printStream prints each message of a following stream with print until
// the stream ends (EOF) or the command does (Canceled), which are no
// errors; any other error of the stream is returned through fail.
func printStream[E any](recv func() (E, error), fail func(error) error, print func(E) error) error {
	for {
		e, err := recv()
		switch {
		case errors.Is(err, io.EOF), status.Code(err) == codes.Canceled:
			return nil
		case err != nil:
			return fail(err)
		}
		if err := print(e); err != nil {
			return err
		}
	}
}

// eventsError is agentError, plus the command that continues a stream
// that fell behind.
func eventsError(addr string, err error) error {
	if fell, ok := csisupdv1.ErrorDetail[*csisupdv1.EventsFellBehind](err); ok {
		return fmt.Errorf("%w; run `csisupd events --index %d` to continue without a gap", agentError(addr, err), fell.GetResumeIndex())
	}
	return agentError(addr, err)
}

// printEvent prints one event: a line of JSON (the Event message, README
// "JSON output"), or a line of text.
func printEvent(w io.Writer, e *csisupdv1.Event, asJSON bool) error {
	if asJSON {
		return printProtoLine(w, e)
	}
	_, err := fmt.Fprintf(w, "%s  %-27s %-20s %s\n", formatTime(e.GetTime()),
		display(e.GetType()), display(e.GetPluginId()), display(e.GetDescription()))
	return err
}
