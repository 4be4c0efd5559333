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
func unknownCommand(group *cobra.Command, name string) usageError {
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

// newHelpCommand is `csisupd help [command]`: cobra's own help prints
// "Unknown help topic" and the root's help, and exits 0, for a command
// that does not exist; this one makes that a usage error naming the
// deepest command it found, with suggestions, as an unknown command is.
func newHelpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Long:  "Help prints the help of any command: csisupd help volume claim.",
		Args:  cobra.ArbitraryArgs,
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			cmd, _, err := c.Root().Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []string
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, sub.Name())
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || cmd == nil {
				cmd = c.Root()
				rest = args
			}
			// Find stops at the deepest command it knows; what is left
			// names no subcommand of it.
			if len(rest) > 0 && (cmd.HasSubCommands() || cmd == c.Root()) {
				return usageOf{cmd: cmd, err: unknownCommand(cmd, rest[0])}
			}
			if len(rest) > 0 {
				return usageOf{cmd: cmd, err: usageError{fmt.Errorf("%q has no subcommands: %q is not one", cmd.CommandPath(), rest[0])}}
			}
			cmd.InitDefaultHelpFlag()
			return cmd.Help()
		},
	}
}
