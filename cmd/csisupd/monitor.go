package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
)

func newMonitorCommand(opts *clientOptions) *cobra.Command {
	var level string
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream the agent's log lines at a level of your choosing",
		Long: "Stream the agent's log lines at --log-level until interrupted. The level is this stream's\n" +
			"only: the agent keeps logging at its own log_level. --json prints the agent's JSON log lines.\n" +
			"The agent never waits for a slow reader: lines it cannot take are dropped, and a warning\n" +
			"line says how many. With ACLs on the token needs agent:read.",
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !config.ValidLogLevel(level) {
				return usageError{fmt.Errorf("--log-level %s: want one of trace, debug, info, warn, error", display(level))}
			}
			conn, err := opts.dial()
			if err != nil {
				return err
			}
			defer conn.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			stream, err := csisupdv1.NewAgentClient(conn).Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: level, Json: opts.json})
			if err != nil {
				return agentError(opts.address, err)
			}
			w := cmd.OutOrStdout()
			for {
				resp, err := stream.Recv()
				switch {
				case errors.Is(err, io.EOF), ctx.Err() != nil && status.Code(err) == codes.Canceled:
					return nil
				case err != nil:
					return agentError(opts.address, err)
				}
				if err := writeLogLines(w, resp.GetData(), opts.json); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().StringVar(&level, "log-level", "info", "level of the lines to stream: trace, debug, info, warn or error")
	return cmd
}

// writeLogLines writes the log lines of data. A text line that a terminal
// would interpret (an escape sequence in a value that came from a plugin)
// is printed quoted, as display does; JSON lines escape such characters
// themselves and are written as they are.
func writeLogLines(w io.Writer, data []byte, asJSON bool) error {
	if asJSON {
		_, err := w.Write(data)
		return err
	}
	var out bytes.Buffer
	for len(data) > 0 {
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		out.WriteString(display(string(line)))
		out.WriteByte('\n')
		data = rest
	}
	_, err := w.Write(out.Bytes())
	return err
}

// monitorLog collects the agent's log stream at level into a buffer of at
// most max bytes until ctx ends; a stream beyond max is cut and reported
// by the error. The error of a stream that could not start, or ended
// before ctx, is returned with what was collected.
func monitorLog(ctx context.Context, cl csisupdv1.AgentClient, addr, level string, max int) ([]byte, error) {
	stream, err := cl.Monitor(ctx, &csisupdv1.MonitorRequest{LogLevel: level})
	if err != nil {
		return nil, agentError(addr, err)
	}
	var buf bytes.Buffer
	for {
		resp, err := stream.Recv()
		switch {
		case errors.Is(err, io.EOF), err != nil && ctx.Err() != nil:
			return buf.Bytes(), nil // the duration is over
		case err != nil:
			return buf.Bytes(), agentError(addr, err)
		}
		if buf.Len()+len(resp.GetData()) > max {
			return buf.Bytes(), fmt.Errorf("the log stream is cut at %d MiB", max>>20)
		}
		buf.Write(resp.GetData())
	}
}
