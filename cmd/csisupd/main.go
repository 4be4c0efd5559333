// Command csisupd is the CSI plugin supervisor: the `agent` daemon and the
// commands that talk to it.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=..."
// (the Makefile's build); currentBuild fills what a build left empty.
// version is `git describe --tags`, commit the full commit id, dirty
// "true" or "false", buildEpoch SOURCE_DATE_EPOCH (the commit's time).
var (
	version    string
	commit     string
	dirty      string
	buildEpoch string
)

// Exit codes of the external contract.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	return runWith(args, os.Stdout, os.Stderr)
}

// runWith runs the command line args with the given standard output and
// error, and returns the exit code.
func runWith(args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, new(usageError)):
		// The usage shown is the one of the command that failed, not
		// the root's.
		var of usageOf
		if errors.As(err, &of) {
			cmd = of.cmd
		}
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintln(stderr, "Error:", displayLines(err.Error()))
		fmt.Fprintln(stderr)
		fmt.Fprint(stderr, cmd.UsageString())
		return exitUsage
	default:
		// Errors may quote servers, files and arguments: escape what a
		// terminal would interpret, keeping the lines of a joined error.
		fmt.Fprintln(stderr, "Error:", displayLines(err.Error()))
		return exitError
	}
}

// usageError marks errors in how the command was called (exit code 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// usageOf is a usage error whose usage is that of cmd rather than of the
// command that ran: help's errors show the usage of the group they name.
type usageOf struct {
	cmd *cobra.Command
	err usageError
}

func (u usageOf) Error() string { return u.err.Error() }
func (u usageOf) Unwrap() error { return u.err }
