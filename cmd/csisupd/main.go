// Command csisupd is the CSI plugin supervisor: the `agent` daemon and the
// commands that talk to it.
package main

import (
	"errors"
	"fmt"
	"os"
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
	root := newRootCommand()
	root.SetArgs(args)
	err := root.Execute()
	if err != nil {
		// Cobra reports an unknown command as a plain error; it is a usage
		// error all the same.
		if _, _, ferr := root.Find(args); ferr != nil {
			err = usageError{err}
		}
	}
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "Error:", displayLines(err.Error()))
		fmt.Fprintln(os.Stderr, "Run 'csisupd --help' for usage.")
		return exitUsage
	default:
		// Errors may quote servers, files and arguments: escape what a
		// terminal would interpret, keeping the lines of a joined error.
		fmt.Fprintln(os.Stderr, "Error:", displayLines(err.Error()))
		return exitError
	}
}

// usageError marks errors in how the command was called (exit code 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }
