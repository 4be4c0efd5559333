package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The agent's container examples of deploy/container/. The podman command
// of the README is the one test/package runs; the others must say the
// same.
const (
	containerReadme  = repoRoot + "/deploy/container/README.md"
	containerQuadlet = repoRoot + "/deploy/container/csisupd.container"
	containerCompose = repoRoot + "/deploy/container/compose.yaml"
)

// agentContainer is what each example of deploy/container/ says of the
// agent's container.
type agentContainer struct {
	network, securityOpt, envFile string
	// volumes are the bind mounts as podman's --volume writes them,
	// SOURCE:TARGET[:OPTIONS], sorted.
	volumes []string
	// image is the reference, args the arguments after it.
	image string
	args  []string
}

// wantAgentContainer is what the examples must say: the host's network,
// no SELinux label, the package's env file, the configuration read-only
// and data_dir rshared, each at the same path inside as outside, and the
// agent given the configuration directory.
var wantAgentContainer = agentContainer{
	network:     "host",
	securityOpt: "label=disable",
	envFile:     "/etc/csisupd.d/csisupd.env",
	volumes:     []string{"/etc/csisupd.d:/etc/csisupd.d:ro", "/var/lib/csisupd:/var/lib/csisupd:rshared"},
	image:       "csisupd:<version>",
	args:        []string{"--config", "/etc/csisupd.d"},
}

// commandContainer reads a `podman run` or `docker run` command of the
// README: its flags up to the image, whose --mount values become volumes.
func commandContainer(t *testing.T, name string) agentContainer {
	t.Helper()
	args, err := DocumentedCommand(containerReadme, "<!-- "+name+" run -->", name)
	if err != nil {
		t.Fatal(err)
	}
	var c agentContainer
	i := 2
	for ; i < len(args) && strings.HasPrefix(args[i], "--"); i++ {
		flag := args[i]
		if flag == "--detach" {
			continue
		}
		if i+1 == len(args) {
			t.Fatalf("%s: %s command: %s has no value", containerReadme, name, flag)
		}
		i++
		switch v := args[i]; flag {
		case "--name":
		case "--network":
			c.network = v
		case "--security-opt":
			c.securityOpt = v
		case "--env-file":
			c.envFile = v
		case "--volume":
			c.volumes = append(c.volumes, v)
		case "--mount":
			c.volumes = append(c.volumes, mountAsVolume(t, v))
		default:
			t.Errorf("%s: %s command: flag %s is not one the examples agree on", containerReadme, name, flag)
		}
	}
	if i == len(args) {
		t.Fatalf("%s: %s command names no image", containerReadme, name)
	}
	c.image, c.args = args[i], args[i+1:]
	slices.Sort(c.volumes)
	return c
}

// mountAsVolume turns docker's --mount type=bind,source=S,target=T[,readonly]
// [,bind-propagation=P] into S:T[:ro|:P].
func mountAsVolume(t *testing.T, mount string) string {
	t.Helper()
	var src, dst string
	var opts []string
	for _, kv := range strings.Split(mount, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "type":
			if v != "bind" {
				t.Errorf("--mount %s: type %q, want bind", mount, v)
			}
		case "source":
			src = v
		case "target":
			dst = v
		case "readonly":
			opts = append(opts, "ro")
		case "bind-propagation":
			opts = append(opts, v)
		default:
			t.Errorf("--mount %s: option %s is not one the examples agree on", mount, k)
		}
	}
	return strings.Join(append([]string{src, dst}, opts...), ":")
}

// quadletContainer reads the quadlet's [Container] section.
func quadletContainer(t *testing.T, ctr map[string][]string) agentContainer {
	t.Helper()
	one := func(key string) string {
		if len(ctr[key]) != 1 {
			t.Errorf("%s: [Container] %s= %q, want one", containerQuadlet, key, ctr[key])
			return ""
		}
		return ctr[key][0]
	}
	c := agentContainer{
		network: one("Network"),
		envFile: one("EnvironmentFile"),
		volumes: slices.Sorted(slices.Values(ctr["Volume"])),
		image:   strings.TrimPrefix(one("Image"), "localhost/"),
		args:    strings.Fields(one("Exec")),
	}
	if one("SecurityLabelDisable") == "true" {
		c.securityOpt = "label=disable"
	}
	return c
}

// composeService is the part of a Compose service the examples agree on.
type composeService struct {
	Image       string   `yaml:"image"`
	Command     []string `yaml:"command"`
	NetworkMode string   `yaml:"network_mode"`
	SecurityOpt []string `yaml:"security_opt"`
	EnvFile     string   `yaml:"env_file"`
	Volumes     []struct {
		Type     string `yaml:"type"`
		Source   string `yaml:"source"`
		Target   string `yaml:"target"`
		ReadOnly bool   `yaml:"read_only"`
		Bind     struct {
			Propagation string `yaml:"propagation"`
		} `yaml:"bind"`
	} `yaml:"volumes"`
}

// composeContainer reads compose.yaml's one service.
func composeContainer(t *testing.T) agentContainer {
	t.Helper()
	data, err := os.ReadFile(containerCompose)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatalf("%s: %v", containerCompose, err)
	}
	s, ok := file.Services["csisupd"]
	if !ok || len(file.Services) != 1 {
		t.Fatalf("%s: services %v, want csisupd alone", containerCompose, file.Services)
	}
	c := agentContainer{network: s.NetworkMode, envFile: s.EnvFile, image: s.Image, args: s.Command}
	if len(s.SecurityOpt) == 1 {
		c.securityOpt = s.SecurityOpt[0]
	}
	for _, v := range s.Volumes {
		if v.Type != "bind" {
			t.Errorf("%s: volume %s is of type %q, want bind", containerCompose, v.Source, v.Type)
		}
		spec := []string{v.Source, v.Target}
		if v.ReadOnly {
			spec = append(spec, "ro")
		}
		if v.Bind.Propagation != "" {
			spec = append(spec, v.Bind.Propagation)
		}
		c.volumes = append(c.volumes, strings.Join(spec, ":"))
	}
	slices.Sort(c.volumes)
	return c
}

// TestContainerExamplesAgree checks that the podman and docker commands of
// deploy/container/README.md, its quadlet and its Compose file run the
// same container, the one wantAgentContainer describes, and that every
// key of the quadlet is one podman-systemd.unit(5) documents.
func TestContainerExamplesAgree(t *testing.T) {
	sections := unitFileKeys(t, containerQuadlet)
	for name, keys := range sections {
		for k := range keys {
			if !slices.Contains(quadletKeys[name], k) {
				t.Errorf("%s: [%s] %s is not a key podman-systemd.unit(5) documents there", containerQuadlet, name, k)
			}
		}
	}
	pre := sections["Service"]["ExecStartPre"]
	for _, want := range []string{"/usr/bin/install -d -m 0700 /var/lib/csisupd", "/usr/bin/install -d -m 0750 /var/lib/csisupd/plugins"} {
		if !slices.Contains(pre, want) {
			t.Errorf("%s: ExecStartPre=%q, want %s: podman refuses a missing source", containerQuadlet, pre, want)
		}
	}

	for _, tc := range []struct {
		name string
		got  agentContainer
	}{
		{"podman run", commandContainer(t, "podman")},
		{"docker run", commandContainer(t, "docker")},
		{"quadlet", quadletContainer(t, sections["Container"])},
		{"compose", composeContainer(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := tc.got, wantAgentContainer
			if got.network != want.network || got.securityOpt != want.securityOpt || got.envFile != want.envFile ||
				got.image != want.image || !slices.Equal(got.args, want.args) || !slices.Equal(got.volumes, want.volumes) {
				t.Errorf("the %s example runs\n  %+v\nwant\n  %+v", tc.name, got, want)
			}
		})
	}
}
