package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Defaults of volume mount.
const (
	// defaultMountOwner owns the claims volume mount takes: one that no
	// engine's reconcile (owner docker) ever releases.
	defaultMountOwner = "cli"
	// defaultMountLease is the lease of the claims volume mount takes: the
	// agent renews it every third of it, and a claim whose agent is gone
	// is released within it.
	defaultMountLease = 30 * time.Second
)

func newVolumeMountCommand(opts *clientOptions) *cobra.Command {
	var (
		workload, owner, accessMode, accessType, link string
		readOnly                                      bool
		lease                                         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "mount ID --workload W",
		Short: "Claim a volume for a workload on the local agent's node, held by that agent until unmount",
		Long: `Claim a volume for a workload that runs on this node (a systemd service, a
script), through the local agent (--address, default 127.0.0.1:4780): the agent
claims it through the servers for its own node, with an owner and a lease, and
renews the lease for as long as it runs, until volume unmount. It prints the
claim's host path, where the workload finds the volume (--json: the claim).
Mounting again with the same workload returns the same claim: nothing is
published twice.

--owner O names who holds the claim (default "cli"), for "volume sync --owner O";
the Docker and Podman integration syncs owner "docker" only, and the systemd
template unit uses "systemd". --lease D (5s to 24h, default 30s) is the claim's
lease: the agent renews it while it runs, and if the agent is stopped for longer
than D, or its node is gone, the servers release the claim.

Without --access-mode, --access-type and --read-only, the claim uses the
volume's first capability, read-write; with any of them, as volume check
does, the access type is mount unless --access-type block, and the access
mode the volume's first capability's unless --access-mode.

--link PATH makes PATH a symbolic link to the host path, replaced atomically
when it is one already (parent directories are made, mode 0755). Anything else
at PATH is refused before the volume is claimed.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "workload"); err != nil {
				return err
			}
			if lease < minLease || lease > maxLease {
				return usageError{fmt.Errorf("--lease %s is out of range: give %s to %s", lease, minLease, maxLease)}
			}
			usage, err := mountUsage(accessMode, accessType, readOnly)
			if err != nil {
				return err
			}
			if link != "" {
				if err := checkLink(link); err != nil {
					return err
				}
			}
			return withClient(opts, cmd.Context(), csisupdv1.NewAgentClient, func(ctx context.Context, cl csisupdv1.AgentClient) error {
				resp, err := cl.ClaimVolume(ctx, &csisupdv1.LocalClaimRequest{
					VolumeId: args[0], WorkloadId: workload, Owner: owner, Lease: durationpb.New(lease), Usage: usage,
				})
				if err != nil {
					return agentError(opts.address, err)
				}
				claim := resp.GetClaim()
				if link != "" {
					if err := replaceLink(link, claim.GetHostPath()); err != nil {
						// A claim nobody can find must not stay held.
						_, rerr := cl.ReleaseVolume(ctx, &csisupdv1.LocalReleaseRequest{VolumeId: args[0], WorkloadId: workload})
						if rerr != nil {
							return errors.Join(err, fmt.Errorf("and releasing the claim again failed: %w", agentError(opts.address, rerr)))
						}
						return fmt.Errorf("%w; the claim is released again", err)
					}
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, claim)
				}
				_, err = fmt.Fprintln(w, display(claim.GetHostPath()))
				return err
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&workload, "workload", "", "id of the workload that uses the volume (required)")
	f.StringVar(&owner, "owner", defaultMountOwner, "who holds the claim, for volume sync --owner")
	f.DurationVar(&lease, "lease", defaultMountLease, "lease of the claim, 5s to 24h, renewed by the agent until unmount")
	f.StringVar(&accessMode, "access-mode", "", "CSI access mode, e.g. single-node-writer, multi-node-reader-only (default: the volume's first capability)")
	f.StringVar(&accessType, "access-type", "", "mount or block (default: the volume's first capability)")
	f.BoolVar(&readOnly, "read-only", false, "claim for reading only")
	f.StringVar(&link, "link", "", "make this path a symbolic link to the claim's host path")
	return cmd
}

func newVolumeUnmountCommand(opts *clientOptions) *cobra.Command {
	var workload, link string
	cmd := &cobra.Command{
		Use:   "unmount ID --workload W",
		Short: "Release a claim volume mount took, through the local agent, which stops holding it",
		Long: `Release a workload's claim that volume mount took, through the local agent
(--address): the volume is unpublished and unstaged on this node, and the agent
stops renewing its lease. A claim that does not exist is released already
(exit 0).

--link PATH then removes PATH if it is a symbolic link; a missing one is fine,
and anything else is left in place and reported. The link is removed even when
the release fails, so that nothing writes through it into a path the volume
may no longer be mounted at; the agent no longer holds the lease then, so the
servers release the claim when it runs out.`,
		Args: rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := requireFlags(cmd, "workload"); err != nil {
				return err
			}
			return withClient(opts, cmd.Context(), csisupdv1.NewAgentClient, func(ctx context.Context, cl csisupdv1.AgentClient) error {
				resp, err := cl.ReleaseVolume(ctx, &csisupdv1.LocalReleaseRequest{VolumeId: args[0], WorkloadId: workload})
				if err != nil {
					err = agentError(opts.address, err)
				}
				if link != "" {
					err = errors.Join(err, removeLink(link))
				}
				if err != nil {
					return err
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp)
				}
				_, err = fmt.Fprintf(w, "Released volume %s of workload %s\n", display(args[0]), display(workload))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&workload, "workload", "", "id of the workload whose claim to release (required)")
	cmd.Flags().StringVar(&link, "link", "", "remove this symbolic link (made by volume mount --link) after the release")
	return cmd
}

// mountUsage is the usage volume mount asks for: nil, the volume's
// default, when no flag of it is given; else as volume check builds it,
// of access type mount unless --access-type block.
func mountUsage(accessMode, accessType string, readOnly bool) (*csisupdv1.VolumeUsage, error) {
	switch accessType {
	case "", "mount", "block":
	default:
		return nil, usageError{fmt.Errorf("--access-type %q: must be mount or block", accessType)}
	}
	usage, err := checkUsage(accessMode, readOnly, accessType == "block")
	if usage == nil && err == nil && accessType == "mount" {
		usage = &csisupdv1.VolumeUsage{AccessType: "mount"}
	}
	return usage, err
}

// checkLink refuses a --link path that holds anything but a symbolic
// link, before anything is claimed.
func checkLink(path string) error {
	_, err := linkAt(path, "refusing to replace it")
	return err
}

// linkAt reports whether path is a symbolic link: false, with no error,
// when there is nothing at path; an error naming path, ending in
// otherwise (what the caller then does), when something else is there.
func linkAt(path, otherwise string) (bool, error) {
	info, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("--link %s: %w", display(path), err)
	case info.Mode()&fs.ModeSymlink == 0:
		return false, fmt.Errorf("--link %s is %s, not a symbolic link: %s", display(path), fileKind(info.Mode()), otherwise)
	}
	return true, nil
}

// replaceLink makes path a symbolic link to target: a new link is made
// beside it and renamed over it, so that path is at every moment the old
// link or the new one. Parent directories are made with mode 0755. A path
// that holds anything but a symbolic link is refused.
func replaceLink(path, target string) error {
	if target == "" {
		return fmt.Errorf("--link %s: the claim has no host path to link to", display(path))
	}
	if err := checkLink(path); err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--link %s: %w", display(path), err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("--link %s: %w", display(path), err)
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".tmp-"+hex.EncodeToString(b[:]))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("--link %s: %w", display(path), err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--link %s: %w", display(path), err)
	}
	return nil
}

// removeLink removes path if it is a symbolic link; a missing path is
// fine, and anything else is left in place and reported.
func removeLink(path string) error {
	if ok, err := linkAt(path, "left in place"); !ok {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--link %s: %w", display(path), err)
	}
	return nil
}

// fileKind names what a file of mode m is, for errors.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	default:
		return "a special file"
	}
}
