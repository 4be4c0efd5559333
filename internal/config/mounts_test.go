package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestPluginMounts(t *testing.T) {
	base := func() Config {
		c := Default()
		c.DataDir = "/var/lib/csisupd"
		c.Client.PluginDir = "/var/lib/csisupd/plugins"
		return c
	}
	type mount struct{ kind, source, target, propagation string }
	tests := []struct {
		name     string
		id       string
		setup    func(*Config)
		want     []mount
		socket   string
		notes    []string // substrings, one per note, in order
		wantErr  string
		volumes  bool
		isMapped bool
	}{
		{
			name: "no plugin block", id: "ebs",
			want: []mount{
				{"socket_dir", "/var/lib/csisupd/plugins/ebs", "/var/lib/csisupd/plugins/ebs", ""},
				{"mount_root", "/var/lib/csisupd/volumes/ebs", "/var/lib/csisupd/volumes/ebs", "rshared"},
				{"dev", "/dev", "/dev", "rshared"},
			},
			socket:  "/var/lib/csisupd/plugins/ebs/csi.sock",
			notes:   []string{`no plugin "ebs" block declares this plugin`},
			volumes: true,
		},
		{
			name: "plugin_mount_dir and mount_dir", id: "ebs",
			setup: func(c *Config) {
				c.Plugins = map[string]PluginConfig{"ebs": {MountDir: "/srv/csi/ebs", PluginMountDir: "/csi/volumes", Type: "node"}}
			},
			want: []mount{
				{"socket_dir", "/var/lib/csisupd/plugins/ebs", "/var/lib/csisupd/plugins/ebs", ""},
				{"mount_root", "/srv/csi/ebs", "/csi/volumes", "rshared"},
				{"dev", "/dev", "/dev", "rshared"},
			},
			socket:   "/var/lib/csisupd/plugins/ebs/csi.sock",
			volumes:  true,
			isMapped: true,
		},
		{
			name: "declared socket outside plugin_dir", id: "nfs",
			setup: func(c *Config) {
				c.Plugins = map[string]PluginConfig{"nfs": {Socket: "/run/nfs-csi/plugin.sock", Type: "monolith", Required: true}}
			},
			want: []mount{
				{"socket_dir", "/run/nfs-csi", "/run/nfs-csi", ""},
				{"mount_root", "/var/lib/csisupd/volumes/nfs", "/var/lib/csisupd/volumes/nfs", "rshared"},
				{"dev", "/dev", "/dev", "rshared"},
			},
			socket:  "/run/nfs-csi/plugin.sock",
			volumes: true,
		},
		{
			name: "controller needs no /dev", id: "ctl",
			setup: func(c *Config) {
				c.Plugins = map[string]PluginConfig{"ctl": {Type: "controller"}}
			},
			want: []mount{
				{"socket_dir", "/var/lib/csisupd/plugins/ctl", "/var/lib/csisupd/plugins/ctl", ""},
				{"mount_root", "/var/lib/csisupd/volumes/ctl", "/var/lib/csisupd/volumes/ctl", "rshared"},
			},
			socket: "/var/lib/csisupd/plugins/ctl/csi.sock",
			notes:  []string{`a controller never stages or publishes, so it needs no /dev`},
		},
		{
			name: "kubelet registration without a declared socket", id: "ebs",
			setup: func(c *Config) {
				c.Client.KubeletRegistrationDir = KubeletRegistrationDir
				c.Plugins = map[string]PluginConfig{"ebs": {Type: "node"}}
			},
			want: []mount{
				{"socket_dir", "/var/lib/csisupd/plugins/ebs", "/var/lib/csisupd/plugins/ebs", ""},
				{"mount_root", "/var/lib/csisupd/volumes/ebs", "/var/lib/csisupd/volumes/ebs", "rshared"},
				{"dev", "/dev", "/dev", "rshared"},
			},
			socket:  "/var/lib/csisupd/plugins/ebs/csi.sock",
			notes:   []string{"client.kubelet_registration_dir is set"},
			volumes: true,
		},
		{
			name: "socket inside the mount root", id: "odd",
			setup: func(c *Config) {
				c.Plugins = map[string]PluginConfig{"odd": {Socket: "/var/lib/csisupd/volumes/odd/csi.sock", Type: "node"}}
			},
			want: []mount{
				{"socket_dir", "/var/lib/csisupd/volumes/odd", "/var/lib/csisupd/volumes/odd", ""},
				{"mount_root", "/var/lib/csisupd/volumes/odd", "/var/lib/csisupd/volumes/odd", "rshared"},
				{"dev", "/dev", "/dev", "rshared"},
			},
			socket:  "/var/lib/csisupd/volumes/odd/csi.sock",
			notes:   []string{"keep the socket out of the mount root"},
			volumes: true,
		},
		{name: "invalid id", id: "../x", wantErr: `plugin id "../x": must match`},
		{name: "dev mode data_dir", id: "ebs", setup: func(c *Config) { c.DataDir = "" }, wantErr: "data_dir is empty"},
		{name: "dev mode plugin_dir", id: "ebs", setup: func(c *Config) { c.Client.PluginDir = "" }, wantErr: "client.plugin_dir is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			if tt.setup != nil {
				tt.setup(&c)
			}
			pm, err := c.PluginMounts(tt.id)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []mount
			for _, m := range pm.Mounts {
				got = append(got, mount{string(m.Kind), m.Source, m.Target, m.Propagation})
				if m.Reason == "" || m.ReadOnly {
					t.Errorf("mount %+v: want a reason and read-write", m)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("mounts\n  %v\nwant\n  %v", got, tt.want)
			}
			if pm.PluginID != tt.id || pm.Socket != tt.socket {
				t.Errorf("plugin %q socket %q, want %q %q", pm.PluginID, pm.Socket, tt.id, tt.socket)
			}
			if pm.Notes == nil || len(pm.Notes) != len(tt.notes) {
				t.Fatalf("notes %q, want %d like %q", pm.Notes, len(tt.notes), tt.notes)
			}
			for i, n := range tt.notes {
				if !strings.Contains(pm.Notes[i], n) {
					t.Errorf("note %d %q does not say %q", i, pm.Notes[i], n)
				}
			}
			if pm.MountsVolumes() != tt.volumes || pm.Mapped() != tt.isMapped {
				t.Errorf("MountsVolumes, Mapped = %v, %v; want %v, %v", pm.MountsVolumes(), pm.Mapped(), tt.volumes, tt.isMapped)
			}
			// The socket directory's reason names the socket file the
			// plugin must create.
			if !strings.Contains(pm.Mounts[0].Reason, tt.socket) {
				t.Errorf("socket reason %q does not name %s", pm.Mounts[0].Reason, tt.socket)
			}
		})
	}
}
