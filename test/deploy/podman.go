package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// QuadletVolumeKeys are the keys podman-systemd.unit(5) documents for the
// [Volume] section of a quadlet .volume file (its podman 5 table; Driver=
// came with podman 4.8, PodmanArgs= with 4.7).
var QuadletVolumeKeys = []string{"ContainersConfModule", "Copy", "Device", "Driver", "GlobalArgs", "Group", "Image",
	"Label", "Options", "PodmanArgs", "ServiceName", "Type", "User", "VolumeName"}

// ReadUnitFile reads a systemd-style unit file: the values of every key,
// by section and key, in file order. Comment and blank lines are skipped;
// a line that is neither a section nor key=value, or that continues on the
// next line, is an error naming it.
func ReadUnitFile(path string) (map[string]map[string][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sections := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if sections[section] == nil {
				sections[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				return nil, fmt.Errorf("%s:%d: %q is not key=value in a section", path, n, line)
			}
			sections[section][k] = append(sections[section][k], v)
		}
	}
	return sections, sc.Err()
}

// QuadletVolumeCreate returns the arguments of the podman command that
// quadlet's generated service runs for the .volume file at path, as
// podman-systemd.unit(5) documents the translation, and the name of the
// volume it creates: by default the file's name without .volume, prefixed
// with systemd-. The arguments start with the global ones (--module=,
// GlobalArgs=), then `volume create --ignore` and the options: --driver=
// from Driver=, --opt copy or nocopy from Copy=, --opt device= and type=
// from Device= and Type=, one --opt o= with uid= and gid= from User= and
// Group= and the mount options of Options=, --label per Label= pair,
// sorted, then PodmanArgs= as written, and the name last. A key quadlet
// does not know, or one it refuses (Type= or Options= without Device=), is
// an error naming it.
func QuadletVolumeCreate(path string) (args []string, name string, err error) {
	sections, err := ReadUnitFile(path)
	if err != nil {
		return nil, "", err
	}
	vol := sections["Volume"]
	for k := range vol {
		if !slices.Contains(QuadletVolumeKeys, k) {
			return nil, "", fmt.Errorf("%s: [Volume] %s is not a key podman-systemd.unit(5) documents", path, k)
		}
	}
	last := func(k string) string {
		if v := vol[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	name = last("VolumeName")
	if name == "" {
		name = "systemd-" + strings.TrimSuffix(filepath.Base(path), ".volume")
	}
	for _, m := range vol["ContainersConfModule"] {
		args = append(args, "--module="+m)
	}
	for _, g := range vol["GlobalArgs"] {
		args = append(args, strings.Fields(g)...)
	}
	args = append(args, "volume", "create", "--ignore")
	driver := last("Driver")
	if driver != "" {
		args = append(args, "--driver="+driver)
	}
	if driver == "image" {
		if last("Image") == "" {
			return nil, "", fmt.Errorf("%s: Driver=image needs Image=", path)
		}
		args = append(args, "--opt", "image="+last("Image"))
	} else {
		var mount []string
		if u := last("User"); u != "" {
			mount = append(mount, "uid="+u)
		}
		if g := last("Group"); g != "" {
			mount = append(mount, "gid="+g)
		}
		switch last("Copy") {
		case "":
		case "true", "yes", "1", "on":
			args = append(args, "--opt", "copy")
		default:
			args = append(args, "--opt", "nocopy")
		}
		device := last("Device")
		if device != "" {
			args = append(args, "--opt", "device="+device)
		}
		for _, k := range []string{"Type", "Options"} {
			if last(k) != "" && device == "" {
				return nil, "", fmt.Errorf("%s: quadlet refuses %s= without Device=", path, k)
			}
		}
		if typ := last("Type"); typ != "" {
			args = append(args, "--opt", "type="+typ)
		}
		if o := last("Options"); o != "" {
			mount = append(mount, o)
		}
		if len(mount) > 0 {
			args = append(args, "--opt", "o="+strings.Join(mount, ","))
		}
	}
	labels := map[string]string{}
	for _, l := range vol["Label"] {
		for _, kv := range strings.Fields(l) {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		args = append(args, "--label", k+"="+labels[k])
	}
	for _, a := range vol["PodmanArgs"] {
		if strings.ContainsAny(a, `"'\`) {
			return nil, "", fmt.Errorf("%s: PodmanArgs=%s: quoted arguments are not translated here", path, a)
		}
		args = append(args, strings.Fields(a)...)
	}
	return append(args, name), name, nil
}

// ReadConfTables reads a TOML file made of tables of `key = value` lines,
// as containers.conf files are: the lines of each table in file order,
// keys and values as written, trimmed. Any other line is an error naming
// it.
func ReadConfTables(path string) (map[string][][2]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	tables := map[string][][2]string{}
	table := ""
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#':
		case line[0] == '[' && line[len(line)-1] == ']':
			table = line[1 : len(line)-1]
			tables[table] = nil
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || table == "" {
				return nil, fmt.Errorf("%s:%d: %q is not key = value in a table", path, n+1, line)
			}
			tables[table] = append(tables[table], [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
		}
	}
	return tables, nil
}

// DocumentedCommand returns the arguments of the one command in the sh
// block that follows the line marker in the Markdown file path: its lines
// joined where they end in a backslash, split at spaces (such a command
// quotes nothing). It is an error when there is no such block or its
// command is not name's.
func DocumentedCommand(path, marker, name string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	_, block, ok := strings.Cut(string(data), marker+"\n```sh\n")
	if !ok {
		return nil, fmt.Errorf("%s: no %q line followed by a sh block", path, marker)
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		return nil, fmt.Errorf("%s: the sh block after %q does not end", path, marker)
	}
	args := strings.Fields(strings.ReplaceAll(block, "\\\n", " "))
	if len(args) == 0 || args[0] != name {
		return nil, fmt.Errorf("%s: the block after %q is not one %s command: %q", path, marker, name, args)
	}
	return args, nil
}

// FlagValues returns the values of flag in args, each given as "flag value".
func FlagValues(args []string, flag string) []string {
	var values []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			values = append(values, args[i+1])
		}
	}
	return values
}
