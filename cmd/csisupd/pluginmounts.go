package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/csisupd/csisupd/internal/config"
)

// Formats of `plugin mounts`.
const (
	mountsPodman  = "podman"
	mountsDocker  = "docker"
	mountsSystemd = "systemd"
	mountsJSON    = "json"
)

// newPluginMountsCommand prints what a plugin's container or unit must
// mount, computed from the agent's own configuration.
func newPluginMountsCommand(opts *clientOptions) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "mounts ID [--config FILE]... [--format podman|docker|systemd|json]",
		Short: "Print the mounts a plugin's container or systemd unit needs beside this agent",
		Long: `Print what plugin ID's container or unit must have so that csisupd can supervise
it and the volumes it mounts reach the host: the directory of its socket, the
mount root with bidirectional (rshared) propagation at the path the plugin sees
it (plugin_mount_dir), and /dev unless the plugin is declared a controller.
Every line says why.

The configuration is the agent's: give the same --config files or directories
and flags as to "csisupd agent"; a configuration the agent would refuse is an
error here too. No agent is contacted.

--format podman (default) and docker print run arguments, one per line;
systemd prints [Service] settings for a plugin binary run as a service; json
(or --json) prints {"plugin_id", "mounts", "notes"}.`,
		Args: rangeArgs(1, 1),
	}
	flags := config.RegisterFlags(cmd.Flags())
	cmd.Flags().StringVar(&format, "format", mountsPodman, "output: podman, docker, systemd or json")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		switch {
		case opts.json && cmd.Flags().Changed("format") && format != mountsJSON:
			return usageError{fmt.Errorf("--json and --format %s disagree: give one", format)}
		case opts.json:
			format = mountsJSON
		}
		switch format {
		case mountsPodman, mountsDocker, mountsSystemd, mountsJSON:
		default:
			return usageError{fmt.Errorf("--format %q: want podman, docker, systemd or json", format)}
		}
		cfg, err := config.Load(config.LoadInput{Flags: flags})
		if err != nil {
			return err
		}
		pm, err := cfg.PluginMounts(args[0])
		if err != nil {
			return usageError{err}
		}
		for _, w := range cfg.Warnings {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
		}
		return renderPluginMounts(cmd.OutOrStdout(), format, pm)
	}
	return cmd
}

// renderPluginMounts writes pm in format.
func renderPluginMounts(w io.Writer, format string, pm config.PluginMounts) error {
	var text string
	var err error
	switch format {
	case mountsJSON:
		return writeJSON(w, pm)
	case mountsPodman:
		text, err = containerArgs(pm, "podman", podmanVolume)
	case mountsDocker:
		text, err = containerArgs(pm, "docker", dockerMount)
	case mountsSystemd:
		text = systemdSettings(pm)
	}
	if err != nil {
		return err
	}
	_, err = io.WriteString(w, text)
	return err
}

// commentWidth is where comment lines are wrapped, so the output reads in
// a terminal; a word longer than that (a path) stays whole.
const commentWidth = 100

// commentLines writes text as "# " lines, wrapped at commentWidth.
func commentLines(b *strings.Builder, text string) {
	line := "#"
	for _, word := range strings.Fields(text) {
		if len(line) > 1 && len(line)+1+len(word) > commentWidth {
			b.WriteString(line + "\n")
			line = "#"
		}
		line += " " + word
	}
	b.WriteString(line + "\n")
}

// containerArgs renders pm as run arguments of a container engine, each
// preceded by the comment that says why, so the output can be read and
// pasted.
func containerArgs(pm config.PluginMounts, engine string, arg func(config.PluginMount) (string, error)) (string, error) {
	var b strings.Builder
	commentLines(&b, fmt.Sprintf("%s run arguments for CSI plugin %q beside csisupd (csisupd plugin mounts).", engine, pm.PluginID))
	for _, n := range pm.Notes {
		commentLines(&b, "Note: "+n+".")
	}
	if pm.MountsVolumes() {
		commentLines(&b, "The container must run --privileged: the plugin calls mount(2) inside it, and its mounts "+
			"reach the host only through the rshared mounts below.")
	} else {
		commentLines(&b, "A controller mounts nothing: it needs no --privileged.")
	}
	for _, m := range pm.Mounts {
		a, err := arg(m)
		if err != nil {
			return "", err
		}
		commentLines(&b, m.Reason+".")
		b.WriteString(a + "\n")
	}
	return b.String(), nil
}

// podmanVolume renders m as podman's --volume=SRC:DST[:OPTIONS]. The
// syntax has no escape for a colon, so a path with one is an error.
func podmanVolume(m config.PluginMount) (string, error) {
	for _, p := range []string{m.Source, m.Target} {
		if strings.Contains(p, ":") {
			return "", fmt.Errorf("%s: podman's --volume cannot name a path with a colon; use --mount", p)
		}
	}
	return shellQuote("--volume=" + m.VolumeSpec()), nil
}

// dockerMount renders m as docker's --mount type=bind,source=...,
// target=...[,readonly][,bind-propagation=...]. A field with a comma or a
// quote is quoted as a CSV field, as the --mount value is CSV.
func dockerMount(m config.PluginMount) (string, error) {
	fields := []string{"type=bind", csvField("source=" + m.Source), csvField("target=" + m.Target)}
	if m.ReadOnly {
		fields = append(fields, "readonly")
	}
	if m.Propagation != "" {
		fields = append(fields, "bind-propagation="+m.Propagation)
	}
	return "--mount " + shellQuote(strings.Join(fields, ",")), nil
}

func csvField(s string) string {
	if !strings.ContainsAny(s, `,"`) {
		return s
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// shellSafe matches words a POSIX shell takes as they are.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:=,@%+-]+$`)

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// systemdSettings renders pm as [Service] settings of a plugin binary run
// as a service beside csisupd.
//
// A plugin that mounts must stay in the host's mount namespace: every
// file system namespace setting of systemd (ReadWritePaths=, BindPaths=,
// ProtectSystem=, PrivateMounts=, PrivateTmp=, ...) gives the service a
// namespace whose mounts are turned into slaves of the host's first, and
// MountFlags=shared does not undo that (systemd.exec(5), PrivateMounts=
// and MountFlags=). So for such a plugin the settings are comments and an
// explicit PrivateMounts=no; only a controller, which never mounts, gets
// ReadWritePaths= and BindPaths=.
func systemdSettings(pm config.PluginMounts) string {
	var b strings.Builder
	commentLines(&b, fmt.Sprintf("[Service] settings for CSI plugin %q run as a service beside csisupd (csisupd plugin mounts).", pm.PluginID))
	for _, n := range pm.Notes {
		commentLines(&b, "Note: "+n+".")
	}
	if pm.MountsVolumes() {
		commentLines(&b, "The plugin stages and publishes volumes: it must mount in the host's mount namespace, "+
			"which a service shares unless it uses a file system namespace setting. Each of them "+
			"(PrivateMounts=, ProtectSystem=, ProtectHome=, PrivateTmp=, PrivateDevices=, ReadWritePaths=, "+
			"ReadOnlyPaths=, InaccessiblePaths=, BindPaths=, ...) turns propagation towards the host off, "+
			"and MountFlags=shared does not turn it on again (systemd.exec(5)): set none of them, so no propagation setting is needed.")
		b.WriteString("PrivateMounts=no\n")
		for _, m := range pm.Mounts {
			commentLines(&b, m.Reason+".")
			switch {
			case m.Kind == config.MountDev:
				commentLines(&b, "The service sees the host's /dev: keep PrivateDevices= off (the default).")
			case m.Source != m.Target:
				commentLines(&b, fmt.Sprintf("plugin_mount_dir is for a plugin in a container: a service sees %s at the host's path, "+
					"and BindPaths=%s:%s would cut its mounts off from the host. Remove plugin_mount_dir for this plugin.",
					m.Source, m.Source, m.Target))
			default:
				commentLines(&b, fmt.Sprintf("The service sees %s at the host's path: nothing to set.", m.Source))
			}
		}
		return b.String()
	}
	commentLines(&b, "A controller never mounts: it may run in a mount namespace of its own, "+
		"so these settings take effect with ProtectSystem=strict and need no propagation setting.")
	for _, m := range pm.Mounts {
		commentLines(&b, m.Reason+".")
		if m.Source != m.Target {
			fmt.Fprintf(&b, "BindPaths=%s:%s\n", systemdPath(m.Source), systemdPath(m.Target))
		} else {
			fmt.Fprintf(&b, "ReadWritePaths=%s\n", systemdPath(m.Source))
		}
	}
	return b.String()
}

// systemdPath escapes a path for a unit file's path list, where '%'
// starts a specifier and whitespace separates items (a quoted item may
// hold it).
func systemdPath(p string) string {
	p = strings.ReplaceAll(p, "%", "%%")
	if strings.ContainsAny(p, " \t\"\\") {
		return `"` + strings.ReplaceAll(strings.ReplaceAll(p, `\`, `\\`), `"`, `\"`) + `"`
	}
	return p
}
