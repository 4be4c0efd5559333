package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// guardGroups makes every command that only groups others (volume,
// operator raft, ...) refuse an argument that names none of its
// subcommands with a usage error. Cobra would print the group's help and
// succeed, so that `csisupd volume frobnicate` exited 0. A group called
// without arguments still prints its help.
func guardGroups(c *cobra.Command) {
	for _, sub := range c.Commands() {
		guardGroups(sub)
	}
	if !c.HasSubCommands() || c.Runnable() {
		return
	}
	c.Args = cobra.ArbitraryArgs
	c.DisableFlagsInUseLine = true
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		return unknownCommand(cmd, args[0])
	}
}

// unknownCommand is the usage error of a subcommand name that group does
// not have, with cobra's suggestions on one readable line.
func unknownCommand(group *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, group.CommandPath())
	if s := group.SuggestionsFor(name); len(s) > 0 {
		q := make([]string, len(s))
		for i, v := range s {
			q[i] = fmt.Sprintf("%q", v)
		}
		msg += "; did you mean " + strings.Join(q, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}
