package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

func newVersionCommand(opts *clientOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the csisupd version",
		Args:  rangeArgs(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.json {
				return printJSON(cmd.OutOrStdout(), map[string]string{
					"version": version, "commit": commit, "go": runtime.Version(),
				})
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "csisupd %s (commit %s, %s)\n", version, commit, runtime.Version())
			return err
		},
	}
}
