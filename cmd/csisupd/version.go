package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func newVersionCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the csisupd version",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.json {
				return printProto(cmd.OutOrStdout(), &csisupdv1.VersionInfo{
					Version: version, Commit: commit, Go: runtime.Version(),
				})
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "csisupd %s (commit %s, %s)\n", version, commit, runtime.Version())
			return err
		},
	}
}
