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
	)
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Print the agent's plugin events: buffered ones first, then new ones as they happen",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			for {
				e, err := stream.Recv()
				switch {
				case errors.Is(err, io.EOF), status.Code(err) == codes.Canceled:
					return nil
				case err != nil:
					return eventsError(opts.address, err)
				}
				if err := printEvent(w, e, opts.json); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().Int32Var(&replay, "replay", 0, "buffered events to print first: 0 all, -1 none")
	cmd.Flags().StringVar(&pluginID, "plugin", "", "only events of this plugin id")
	cmd.Flags().Uint64Var(&fromIndex, "index", 0, "start after the event with this index (instead of --replay): continues a stream that fell behind")
	return cmd
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
