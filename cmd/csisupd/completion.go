package main

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/volspec"
)

// completionTimeout bounds the API call of one completion: a shell waits
// for it at every Tab.
const completionTimeout = time.Second

// enumFlags are the values of the flags that take one of a fixed set, by
// flag name; a command path limits a flag name other commands use
// otherwise.
var enumFlags = []struct {
	flag, path string
	values     func() []string
}{
	{"access-mode", "", func() []string { return slices.Sorted(maps.Keys(volspec.AccessModes)) }},
	{"access-type", "", func() []string { return []string{"mount", "block"} }},
	{"log-level", "csisupd monitor", config.LogLevels},
	{"format", "csisupd plugin mounts", func() []string { return []string{mountsPodman, "docker", "systemd", mountsJSON} }},
}

// idKind is a kind of id that completion lists through the API.
type idKind int

const (
	noIDs idKind = iota
	volumeIDs
	snapshotIDs
	pluginIDs
	nodeIDs
)

// idFlags are the flags that name a volume, plugin or node.
var idFlags = map[string]idKind{"volume": volumeIDs, "plugin": pluginIDs, "node": nodeIDs}

// registerCompletions adds completions to every command under root: the
// values of enumFlags, and the ids of volumes, snapshots, plugins and
// nodes, listed through the API at the address the command line names,
// for id flags and for a first argument that is an id (by the command's
// Use: ID, VOLUME, SNAPSHOT, NODE). An id completion that gets no answer
// within completionTimeout offers nothing, and says nothing.
func registerCompletions(root *cobra.Command, opts *clientOptions) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		path := c.CommandPath()
		c.Flags().VisitAll(func(f *pflag.Flag) {
			for _, e := range enumFlags {
				if f.Name == e.flag && (e.path == "" || e.path == path) {
					values := e.values()
					_ = c.RegisterFlagCompletionFunc(f.Name, func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
						return values, cobra.ShellCompDirectiveNoFileComp
					})
				}
			}
			if kind, ok := idFlags[f.Name]; ok && !strings.HasPrefix(path, "csisupd tls") {
				_ = c.RegisterFlagCompletionFunc(f.Name, func(_ *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
					return listIDs(opts, kind, prefix), cobra.ShellCompDirectiveNoFileComp
				})
			}
		})
		if kind := argKind(c); kind != noIDs && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = func(_ *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if len(args) == 0 {
					return listIDs(opts, kind, prefix), cobra.ShellCompDirectiveNoFileComp
				}
				if path == "csisupd volume availability" && len(args) == 1 {
					return []string{"active", "pause", "drain"}, cobra.ShellCompDirectiveNoFileComp
				}
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
		}
	}
	walk(root)
}

// argKind is the kind of id a command's first argument is, read from its
// Use line: the group it is in says what an ID is. Commands that make a
// new id (create, register) take none to complete.
func argKind(c *cobra.Command) idKind {
	fields := strings.Fields(c.Use)
	if len(fields) < 2 || c.Parent() == nil || c.Name() == "create" && fields[1] != "VOLUME" || c.Name() == "register" {
		return noIDs
	}
	arg := strings.Trim(fields[1], "[]")
	switch {
	case arg == "VOLUME":
		return volumeIDs
	case arg == "SNAPSHOT":
		return snapshotIDs
	case arg == "NODE":
		return nodeIDs
	case arg == "ID" && c.Parent().Name() == "volume":
		return volumeIDs
	case arg == "ID" && c.Parent().Name() == "plugin":
		return pluginIDs
	}
	return noIDs
}

// listIDs asks the cluster for the ids of kind that start with prefix. It
// returns nothing when the call fails or takes longer than
// completionTimeout: a completion never prints an error.
func listIDs(opts *clientOptions, kind idKind, prefix string) []string {
	conn, err := opts.dial()
	if err != nil {
		return nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	cl := csisupdv1.NewControlClient(conn)
	var ids []string
	switch kind {
	case volumeIDs:
		resp, err := cl.ListVolumes(ctx, &csisupdv1.VolumeListRequest{})
		if err != nil {
			return nil
		}
		for _, v := range resp.GetVolumes() {
			ids = append(ids, v.GetId())
		}
	case snapshotIDs:
		resp, err := cl.ListVolumeSnapshots(ctx, &csisupdv1.VolumeSnapshotListRequest{})
		if err != nil {
			return nil
		}
		for _, s := range resp.GetSnapshots() {
			ids = append(ids, s.GetId())
		}
	case pluginIDs:
		resp, err := cl.ListPlugins(ctx, &csisupdv1.PluginListRequest{})
		if err != nil {
			return nil
		}
		for _, p := range resp.GetPlugins() {
			ids = append(ids, p.GetId())
		}
	case nodeIDs:
		// A node is named by its id or its name.
		resp, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{})
		if err != nil {
			return nil
		}
		for _, n := range resp.GetNodes() {
			ids = append(ids, n.GetId())
			if n.GetName() != "" {
				ids = append(ids, n.GetName())
			}
		}
	}
	var out []string
	for _, id := range ids {
		// An id that could rewrite the terminal is not offered.
		if strings.HasPrefix(id, prefix) && display(id) == id {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
