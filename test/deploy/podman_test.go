package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/config"
)

// The podman examples of deploy/podman/.
const (
	podmanVolumeUnit    = repoRoot + "/deploy/podman/csisupd-data.volume"
	podmanContainersCfg = repoRoot + "/deploy/podman/containers.conf"
)

// TestQuadletVolumeKeysAndCommand checks the quadlet volume unit with no
// podman needed: its [Volume] keys are those podman-systemd.unit(5)
// documents, its [Unit] keys pass to systemd, it names the csisupd driver
// and starts after the agent, and quadlet turns it into exactly the podman
// volume create command below (test/e2e runs that command against a real
// agent).
func TestQuadletVolumeKeysAndCommand(t *testing.T) {
	sections := unitFileKeys(t, podmanVolumeUnit)
	for name, keys := range sections {
		if name != "Unit" && name != "Volume" {
			t.Errorf("%s: section [%s] is not one the example needs", podmanVolumeUnit, name)
		}
		for k := range keys {
			if name == "Unit" && !slices.Contains(quadletKeys["Unit"], k) {
				t.Errorf("%s: [Unit] %s is not a key of systemd.unit(5) the example needs", podmanVolumeUnit, k)
			}
		}
	}
	if got := sections["Volume"]["Driver"]; !slices.Equal(got, []string{"csisupd"}) {
		t.Errorf("%s: Driver=%q, want csisupd (the name containers.conf gives the plugin)", podmanVolumeUnit, got)
	}
	for _, k := range []string{"Requires", "After"} {
		if !slices.Contains(sections["Unit"][k], "csisupd.service") {
			t.Errorf("%s: %s= must name csisupd.service: the agent serves the plugin's socket", podmanVolumeUnit, k)
		}
	}
	args, name, err := QuadletVolumeCreate(podmanVolumeUnit)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"volume", "create", "--ignore", "--driver=csisupd", "--label", "app=data",
		"--opt", "size=1GiB", "--opt", "access_mode=single-node-writer", "systemd-csisupd-data"}
	if name != "systemd-csisupd-data" || !slices.Equal(args, want) {
		t.Errorf("%s translates to podman %q (volume %s), want podman %q", podmanVolumeUnit, args, name, want)
	}
}

// TestQuadletVolumeCreate checks the translation itself on units that use
// the keys the example does not, and the ones quadlet refuses.
func TestQuadletVolumeCreate(t *testing.T) {
	for _, tc := range []struct {
		name, unit string
		want       string // the arguments, space-separated; "" when refused
		err        string
	}{
		{name: "defaults", unit: "[Volume]\n", want: "volume create --ignore systemd-v"},
		{name: "volume name", unit: "[Volume]\nVolumeName=data\nDriver=csisupd\n", want: "volume create --ignore --driver=csisupd data"},
		{name: "mount options",
			unit: "[Volume]\nUser=10\nGroup=20\nDevice=/dev/sdb\nType=ext4\nOptions=noatime\nCopy=false\n",
			want: "volume create --ignore --opt nocopy --opt device=/dev/sdb --opt type=ext4 --opt o=uid=10,gid=20,noatime systemd-v"},
		{name: "labels sorted", unit: "[Volume]\nLabel=b=2 a=1\nLabel=c=3\n", want: "volume create --ignore --label a=1 --label b=2 --label c=3 systemd-v"},
		{name: "global args", unit: "[Volume]\nContainersConfModule=/etc/m.conf\nGlobalArgs=--log-level=debug\nPodmanArgs=--opt plugin=tp\n",
			want: "--module=/etc/m.conf --log-level=debug volume create --ignore --opt plugin=tp systemd-v"},
		{name: "image driver", unit: "[Volume]\nDriver=image\nImage=localhost/img\n", want: "volume create --ignore --driver=image --opt image=localhost/img systemd-v"},
		{name: "options without device", unit: "[Volume]\nOptions=plugin=tp\n", err: "Options= without Device="},
		{name: "type without device", unit: "[Volume]\nType=ext4\n", err: "Type= without Device="},
		{name: "unknown key", unit: "[Volume]\nSize=1G\n", err: "Size is not a key"},
		{name: "quoted args", unit: "[Volume]\nPodmanArgs=--opt \"a=b c\"\n", err: "quoted"},
		{name: "not a unit", unit: "Driver=csisupd\n", err: "is not key=value in a section"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "v.volume")
			if err := os.WriteFile(path, []byte(tc.unit), 0o600); err != nil {
				t.Fatal(err)
			}
			args, _, err := QuadletVolumeCreate(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %q, %v; want an error saying %q", args, err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(args, " ") != tc.want {
				t.Fatalf("got %q, %v; want %q", strings.Join(args, " "), err, tc.want)
			}
		})
	}
}

// TestPodmanContainersConf checks the containers.conf entry: it names the
// plugin csisupd at the agent's default socket, and lets a plugin call
// last as long as the agent lets a claim take, rather than podman's
// default of 5 seconds.
func TestPodmanContainersConf(t *testing.T) {
	list, err := ReadConfTables(podmanContainersCfg)
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]map[string]string{}
	for name, kvs := range list {
		tables[name] = map[string]string{}
		for _, kv := range kvs {
			tables[name][kv[0]] = kv[1]
		}
	}
	if got, want := tables["engine.volume_plugins"]["csisupd"], fmt.Sprintf("%q", config.DefaultDockerSocket); got != want {
		t.Errorf("%s: [engine.volume_plugins] csisupd = %s, want %s", podmanContainersCfg, got, want)
	}
	timeout, err := strconv.Atoi(tables["engine"]["volume_plugin_timeout"])
	if err != nil || timeout < int(config.DefaultRPCTimeout.Seconds()) {
		t.Errorf("%s: [engine] volume_plugin_timeout = %q, want at least %v in seconds", podmanContainersCfg,
			tables["engine"]["volume_plugin_timeout"], config.DefaultRPCTimeout)
	}
}
