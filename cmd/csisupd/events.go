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
		replay   int32
		pluginID string
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
			stream, err := csisupdv1.NewAgentClient(conn).WatchEvents(cmd.Context(),
				&csisupdv1.WatchEventsRequest{Replay: replay, PluginId: pluginID})
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
					return agentError(opts.address, err)
				}
				if err := printEvent(w, e, opts.json); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().Int32Var(&replay, "replay", 0, "buffered events to print first: 0 all, -1 none")
	cmd.Flags().StringVar(&pluginID, "plugin", "", "only events of this plugin id")
	return cmd
}

// eventJSON is one line of `events --json` (README, "JSON output": a
// stable contract).
type eventJSON struct {
	Time        string `json:"time"`
	Type        string `json:"type"`
	PluginID    string `json:"plugin_id"`
	Description string `json:"description"`
	Index       uint64 `json:"index"`
}

func printEvent(w io.Writer, e *csisupdv1.Event, asJSON bool) error {
	if asJSON {
		line := eventJSON{Time: formatTime(e.GetTime()), Type: e.GetType(), PluginID: e.GetPluginId(),
			Description: e.GetDescription(), Index: e.GetIndex()}
		return jsonLine(w, line)
	}
	_, err := fmt.Fprintf(w, "%s  %-27s %-20s %s\n", formatTime(e.GetTime()),
		display(e.GetType()), display(e.GetPluginId()), display(e.GetDescription()))
	return err
}
