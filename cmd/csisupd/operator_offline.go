package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/csisupd/csisupd/internal/agent"
)

// offlinePeersOptions are the flags of `operator raft offline-peers`.
type offlinePeersOptions struct {
	dataDir     string
	peersJSON   bool
	keep        []string
	lockTimeout time.Duration
}

// newRaftOfflinePeersCommand reads a stopped server's data dir: the one
// view of the raft configuration left when no server can answer.
func newRaftOfflinePeersCommand(opts *clientOptions) *cobra.Command {
	var o offlinePeersOptions
	cmd := &cobra.Command{
		Use:   "offline-peers --data-dir DIR",
		Short: "Print the last known raft configuration from a stopped server's data dir (outage recovery)",
		Long: `Print the last raft configuration a stopped server knew, read from its data
dir (the newest snapshot and any later configuration entries of the raft log),
with the last index and term. The server must be stopped: a running server
locks its raft store, and the command says so.

With --peers-json it prints a peers.json for outage recovery instead; --keep
limits it to the given server ids (the surviving servers). Place the file in
<data_dir>/server/raft/peers.json on every surviving server before starting
them; each server applies and removes it at start.`,
		Args: rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.dataDir == "" {
				return usageError{errors.New("--data-dir is required")}
			}
			if len(o.keep) > 0 && !o.peersJSON {
				return usageError{errors.New("--keep applies to --peers-json only")}
			}
			if o.lockTimeout <= 0 {
				return usageError{fmt.Errorf("--lock-timeout %s: want a positive duration", o.lockTimeout)}
			}
			st, err := agent.ReadOfflineRaftState(o.dataDir, o.lockTimeout)
			if errors.Is(err, agent.ErrServerRunning) {
				return fmt.Errorf("data dir %s: stop the server first (its raft store stayed locked for %s): %w", o.dataDir, o.lockTimeout, err)
			}
			if err != nil {
				return fmt.Errorf("data dir %s: %w", o.dataDir, err)
			}
			w := cmd.OutOrStdout()
			if o.peersJSON {
				peers, err := st.PeersFile(o.keep)
				if err != nil {
					return err
				}
				return writeJSON(w, peers)
			}
			if opts.json {
				return writeJSON(w, st)
			}
			return printOfflineState(w, o.dataDir, st)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.dataDir, "data-dir", "", "the stopped agent's data_dir")
	f.BoolVar(&o.peersJSON, "peers-json", false, "print a peers.json for outage recovery")
	f.StringSliceVar(&o.keep, "keep", nil, "with --peers-json, only these server ids (comma-separated)")
	f.DurationVar(&o.lockTimeout, "lock-timeout", 2*time.Second, "how long to wait for the raft store's lock")
	return cmd
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode JSON: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func printOfflineState(w io.Writer, dataDir string, st agent.OfflineRaftState) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRAFT ADDRESS\tSUFFRAGE")
	for _, p := range st.Servers {
		row(tw, p.ID, p.Address, p.Suffrage)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nConfiguration index %d (from the %s), last index %d, last term %d\n",
		st.ConfigurationIndex, display(st.ConfigurationSource), st.LastIndex, st.LastTerm)
	if st.PeersFilePending {
		fmt.Fprintf(w, "A peers.json waits for the next start: %s\n", display(agent.PeersFilePath(dataDir)))
	}
	_, err := fmt.Fprintln(w, "This is the state on disk; the cluster may have changed since the server stopped.")
	return err
}
