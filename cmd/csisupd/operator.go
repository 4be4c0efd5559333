package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/safefile"
)

// snapshotChunkSize is the size of one SnapshotRestore message.
const snapshotChunkSize = 64 << 10

func newOperatorCommand(opts *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Operate the server cluster: raft peers, snapshots, debug bundles",
		Args:  rangeArgs(0, 0),
	}
	raftCmd := &cobra.Command{
		Use:   "raft",
		Short: "Inspect and change the raft configuration",
		Args:  rangeArgs(0, 0),
	}
	raftCmd.AddCommand(newRaftListPeersCommand(opts), newRaftRemovePeerCommand(opts))
	raftCmd.AddCommand(newRaftOfflinePeersCommand(opts))
	snapCmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Save and restore snapshots of the replicated state",
		Args:  rangeArgs(0, 0),
	}
	snapCmd.AddCommand(newSnapshotSaveCommand(opts), newSnapshotRestoreCommand(opts))
	cmd.AddCommand(raftCmd, snapCmd, newOperatorDebugCommand(opts))
	return cmd
}

func newRaftListPeersCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "list-peers",
		Short: "List the servers of the raft configuration, as the leader sees them",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.RaftPeers(ctx, &csisupdv1.RaftPeersRequest{})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tRAFT ADDRESS\tRPC ADDRESS\tSUFFRAGE\tLEADER\tHEALTHY\tSTABLE SINCE\tLAST CONTACT\tLAST INDEX\tLAST TERM")
				for _, p := range resp.GetPeers() {
					row(tw, p.GetId(), p.GetRaftAddress(), dash(p.GetRpcAddress()), p.GetSuffrage(), fmt.Sprint(p.GetLeader()),
						peerHealthy(p), stableSince(p), lastContact(p), fmt.Sprint(p.GetLastIndex()), fmt.Sprint(p.GetLastTerm()))
				}
				return tw.Flush()
			})
		},
	}
}

// peerHealthy is the HEALTHY cell: "-" before the leader's autopilot
// first judged the server.
func peerHealthy(p *csisupdv1.RaftPeer) string {
	if p.GetStableSince() == nil {
		return "-"
	}
	return fmt.Sprint(p.GetHealthy())
}

// stableSince is the STABLE SINCE cell: how long the server's health has
// been what HEALTHY says.
func stableSince(p *csisupdv1.RaftPeer) string {
	if p.GetStableSince() == nil {
		return "-"
	}
	return ago(p.GetStableSince())
}

// lastContact is the LAST CONTACT cell: how long ago the server last heard
// from the leader.
func lastContact(p *csisupdv1.RaftPeer) string {
	if p.GetLastContactMs() < 0 {
		return "-"
	}
	return (time.Duration(p.GetLastContactMs()) * time.Millisecond).String()
}

func newRaftRemovePeerCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "remove-peer ID",
		Short: "Remove a server from the raft configuration",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.RemovePeer(ctx, &csisupdv1.RaftRemovePeerRequest{Id: args[0]})
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					// The call's response has no fields: {} and exit code 0.
					return printProto(w, resp)
				}
				_, err = fmt.Fprintf(w, "Removed peer %s\n", display(args[0]))
				return err
			})
		},
	}
}

func newSnapshotSaveCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "save FILE",
		Short: "Save a snapshot of the replicated state, taken on the leader, to FILE",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				n, err := saveSnapshot(ctx, cl, opts.address, path)
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, &csisupdv1.SnapshotSaveResult{File: path, Bytes: n})
				}
				_, err = fmt.Fprintf(w, "Saved snapshot to %s (%d bytes)\n", display(path), n)
				return err
			})
		},
	}
}

// saveSnapshot streams a snapshot into a temporary file next to path and
// renames it into place only when the stream completed.
func saveSnapshot(ctx context.Context, cl csisupdv1.ControlClient, addr, path string) (int64, error) {
	stream, err := cl.SnapshotSave(ctx, &csisupdv1.SnapshotSaveRequest{})
	if err != nil {
		return 0, controlError(addr, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return 0, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	defer func() {
		if f != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	var n int64
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, controlError(addr, err)
		}
		m, err := f.Write(chunk.GetData())
		n += int64(m)
		if err != nil {
			return 0, fmt.Errorf("snapshot file %s: %w", path, err)
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("server %s sent an empty snapshot", addr)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return 0, fmt.Errorf("snapshot file %s: %w", path, err)
	}
	f = nil
	return n, nil
}

// maxSnapshotFileSize caps a snapshot file to restore: the servers refuse
// a larger one.
const maxSnapshotFileSize = 512 << 20

func newSnapshotRestoreCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the replicated state with a snapshot saved by `operator snapshot save`",
		Args:  rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			data, err := safefile.Read(cmd.Context(), path, safefile.Spec{What: "snapshot file", MaxSize: maxSnapshotFileSize})
			if err != nil {
				return err
			}
			if len(data) == 0 {
				return fmt.Errorf("snapshot file %s is empty", path)
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				stream, err := cl.SnapshotRestore(ctx)
				if err != nil {
					return controlError(opts.address, err)
				}
				for rest := data; len(rest) > 0; {
					n := min(len(rest), snapshotChunkSize)
					if err := stream.Send(&csisupdv1.SnapshotChunk{Data: rest[:n]}); err != nil {
						if errors.Is(err, io.EOF) {
							break // the server ended the stream; CloseAndRecv has its status
						}
						return controlError(opts.address, err)
					}
					rest = rest[n:]
				}
				resp, err := stream.CloseAndRecv()
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				_, err = fmt.Fprintf(w, "Restored snapshot %s (raft index %d)\n", display(path), resp.GetIndex())
				return err
			})
		},
	}
}
