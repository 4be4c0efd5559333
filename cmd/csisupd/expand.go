package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/volspec"
)

// expandRequest builds the ExpandVolume request of volume expand.
func expandRequest(id, capacity, capacityMax string, secrets []string) (*csisupdv1.VolumeExpandRequest, error) {
	if strings.TrimSpace(capacity) == "" {
		return nil, usageError{errors.New("required flag(s) --capacity not set")}
	}
	req := &csisupdv1.VolumeExpandRequest{Id: id}
	var err error
	if req.CapacityMinBytes, err = parseSizeFlag("capacity", capacity); err != nil {
		return nil, err
	}
	if req.CapacityMinBytes == 0 {
		return nil, usageError{errors.New("--capacity: the size to grow to must be more than 0")}
	}
	if capacityMax != "" {
		if req.CapacityMaxBytes, err = parseSizeFlag("capacity-max", capacityMax); err != nil {
			return nil, err
		}
		if req.CapacityMaxBytes < req.CapacityMinBytes {
			return nil, usageError{fmt.Errorf("--capacity-max %s is less than --capacity %s", capacityMax, capacity)}
		}
	}
	if req.Secrets, err = parseKeyValues("secret", secrets); err != nil {
		return nil, err
	}
	return req, nil
}

func newVolumeExpandCommand(opts *clientOptions) *cobra.Command {
	var (
		capacity, capacityMax string
		secrets               []string
	)
	cmd := &cobra.Command{
		Use:   "expand ID --capacity SIZE",
		Short: "Grow a volume: in the controller, then on every node that mounts it",
		Long: `Grow a volume to at least --capacity: ControllerExpandVolume through the
volume's controller when the plugin can, then NodeExpandVolume on every node
where the volume is mounted when the plugin needs it. The servers record each
step, and finish an expansion that a crash or a leader change interrupted;
volume status shows one under way. A shrink, or a size over the volume's
capacity limit, is refused.`,
		Example: `  csisupd volume expand data --capacity 20GiB`,
		Args:    rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := expandRequest(args[0], capacity, capacityMax, secrets)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.ExpandVolume(ctx, req)
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp.GetVolume())
				}
				return printExpandResult(w, resp.GetVolume())
			})
		},
	}
	cmd.Flags().StringVar(&capacity, "capacity", "", "the size to grow to, e.g. 20GiB (required)")
	cmd.Flags().StringVar(&capacityMax, "capacity-max", "", "the most the plugin may make it (default: the volume's capacity limit)")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

// printExpandResult says whether the expansion finished, or what it
// waits for.
func printExpandResult(w io.Writer, v *csisupdv1.Volume) error {
	if e := v.GetExpansion(); e != nil {
		_, err := fmt.Fprintf(w, "Expanding volume %s to %s: %s (see volume status %s)\n", display(v.GetId()),
			formatBytes(e.GetCapacityBytes()), expansionProgress(e), display(v.GetId()))
		return err
	}
	_, err := fmt.Fprintf(w, "Expanded volume %s: capacity %s\n", display(v.GetId()), formatBytes(v.GetCapacityBytes()))
	return err
}

// expansionProgress describes the step an expansion waits for.
func expansionProgress(e *csisupdv1.VolumeExpansion) string {
	var s string
	switch e.GetState() {
	case "controller":
		s = "waiting for the controller"
	case "nodes":
		s = fmt.Sprintf("waiting for %d node(s)", len(e.GetNodesPending()))
	default:
		s = "state " + display(dash(e.GetState()))
	}
	if e.GetLastError() != "" {
		s += "; last error: " + display(e.GetLastError())
	}
	return s
}

// modifyRequest builds the ModifyVolume request of volume modify.
func modifyRequest(id string, params, secrets []string) (*csisupdv1.VolumeModifyRequest, error) {
	if len(params) == 0 {
		return nil, usageError{errors.New("required flag(s) --parameter not set: give the mutable parameters to change")}
	}
	req := &csisupdv1.VolumeModifyRequest{Id: id}
	var err error
	if req.MutableParameters, err = parseKeyValues("parameter", params); err != nil {
		return nil, err
	}
	if req.Secrets, err = parseKeyValues("secret", secrets); err != nil {
		return nil, err
	}
	return req, nil
}

func newVolumeModifyCommand(opts *clientOptions) *cobra.Command {
	var params, secrets []string
	cmd := &cobra.Command{
		Use:   "modify ID --parameter k=v...",
		Short: "Change a volume's mutable parameters (ControllerModifyVolume)",
		Long: `Change a volume's mutable parameters, such as a provisioned IOPS rate, through
the plugin's ControllerModifyVolume (the MODIFY_VOLUME capability), and record
them.`,
		Example: `  csisupd volume modify data --parameter iops=6000`,
		Args:    rangeArgs(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := modifyRequest(args[0], params, secrets)
			if err != nil {
				return err
			}
			return opts.withControl(cmd.Context(), func(ctx context.Context, cl csisupdv1.ControlClient) error {
				resp, err := cl.ModifyVolume(ctx, req)
				if err != nil {
					return controlError(opts.address, err)
				}
				w := cmd.OutOrStdout()
				if opts.json {
					return printProto(w, resp.GetVolume())
				}
				_, err = fmt.Fprintf(w, "Modified volume %s: mutable parameters %s\n", display(args[0]), formatMap(resp.GetVolume().GetMutableParameters()))
				return err
			})
		},
	}
	cmd.Flags().StringArrayVar(&params, "parameter", nil, "mutable parameter key=value to set (required); repeatable")
	cmd.Flags().StringArrayVar(&secrets, "secret", nil, "secret key=value passed to the plugin, never stored or printed; repeatable")
	return cmd
}

// parseSizeFlag parses the value of a size flag. A number without a unit
// other than 0 is refused, with the unit it most likely lacks: a volume
// of 10 bytes is never what `--capacity 10` meant. Bytes are written 10B.
// (A spec file takes bare bytes as Nomad's does.)
func parseSizeFlag(flag, value string) (int64, error) {
	if t := strings.TrimSpace(value); bareNumber(t) && strings.Trim(t, "0.") != "" {
		return 0, fmt.Errorf("--%s %s: did you mean %sGiB? sizes need a unit (B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB; %sB is bytes)", flag, t, t, t)
	}
	n, err := volspec.ParseSize(value)
	if err != nil {
		return 0, usageError{fmt.Errorf("--%s: %w", flag, err)}
	}
	return n, nil
}

// bareNumber reports whether s is a decimal number without a unit, such
// as 10 or 1.5.
func bareNumber(s string) bool {
	if s == "" || strings.Trim(s, "0123456789.") != "" {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
