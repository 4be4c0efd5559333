package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/csisupd/csisupd/internal/config"
)

// newValidateCommand is `csisupd validate`: it checks agent configuration
// or volume specification files the way the agent and `volume create`
// read them, and starts, creates and contacts nothing.
func newValidateCommand() *cobra.Command {
	var volumeSpec bool
	cmd := &cobra.Command{
		Use:   "validate PATH... [--volume-spec]",
		Short: "Check agent configuration files and directories, or volume specification files",
		Long: `Check agent configuration files and directories, or with --volume-spec volume
specification files, and print every problem with its file and line.

The configuration PATHs are read together, in order, as 'csisupd agent
--config PATH...' reads them: a directory stands for its *.hcl files. The
environment (CSISUPD_*) and agent flags are not applied: what is checked is
the files. Nothing is started and no directory is created; the checks that
the agent makes of the directories it runs with (owner and mode of data_dir
and plugin_dir) need the running host and are made at agent start.

With --volume-spec each PATH is a volume specification file, as given to
'volume create -f' or 'volume register -f' ("-" reads standard input).

Exit code 0 when every PATH is valid, 1 when one has a problem.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageError{errors.New("validate needs at least one PATH")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if volumeSpec {
				return validateVolumeSpecs(cmd, args)
			}
			return validateConfig(cmd, args)
		},
	}
	cmd.Flags().BoolVar(&volumeSpec, "volume-spec", false, "the PATHs are volume specification files, not agent configuration")
	return cmd
}

// validateConfig loads paths with the agent's loader and reports its
// problems and warnings.
func validateConfig(cmd *cobra.Command, paths []string) error {
	c, err := config.Load(config.LoadInput{
		Files: paths,
		Env:   func(string) string { return "" },
	})
	if err != nil {
		return problems(err)
	}
	for _, w := range c.Warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "Warning:", display(w))
	}
	if len(c.Sources) == 0 {
		_, err = fmt.Fprintln(cmd.OutOrStdout(), "configuration valid: no *.hcl file read, the defaults apply")
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "configuration valid: %s\n", display(strings.Join(c.Sources, ", ")))
	return err
}

// validateVolumeSpecs parses every path as a volume specification.
func validateVolumeSpecs(cmd *cobra.Command, paths []string) error {
	var errs []error
	for _, p := range paths {
		if _, err := readSpec(p, cmd.InOrStdin()); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: valid\n", display(p)); err != nil {
			return err
		}
	}
	if len(errs) > 0 {
		return problems(errors.Join(errs...))
	}
	return nil
}

// problems heads the joined problems of err with their count, one problem
// a line below it.
func problems(err error) error {
	n := strings.Count(err.Error(), "\n") + 1
	s := "s"
	if n == 1 {
		s = ""
	}
	return fmt.Errorf("%d problem%s found:\n%w", n, s, err)
}
