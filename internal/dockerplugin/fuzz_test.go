package dockerplugin

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/volreq"
	"github.com/csisupd/csisupd/internal/volspec"
)

// FuzzCreateOptions feeds three Create options to the option parser.
// What it lets through is a create request the servers' checks take, of
// the volume named, with one capability of a known mode and no size
// below a mebibyte; a secret option is always refused, and its value is
// never in the error.
func FuzzCreateOptions(f *testing.F) {
	for _, seed := range [][6]string{
		{"size", "16MiB", "plugin", "ebs", "access_mode", "single-node-writer"},
		{"size", "10", "access_type", "block", "fs_type", "ext4"},
		{"topology", "zone=a,rack=1;zone=b", "mount_flags", "noatime,bind", "parameter.type", "gp3"},
		{"secret.password", "hunter2hunter2", "snapshot", "s1", "clone", "v0"},
		{"parameter.", "x", "topology", "=;", "size", "-1G"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3], seed[4], seed[5])
	}
	s := &Server{cfg: Config{DefaultPlugin: "testplugin"}}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		opts := map[string]string{k1: v1, k2: v2, k3: v3}
		o, err := s.parseOpts("v1", opts)
		for k, v := range opts {
			if !strings.HasPrefix(k, secretPrefix) {
				continue
			}
			if err == nil {
				t.Fatalf("option %q was taken", k)
			}
			if len(v) >= 8 && !elsewhere(opts, k, v) && strings.Contains(err.Error(), v) {
				t.Fatalf("error %q carries the value of %q", err, k)
			}
		}
		if err != nil {
			return
		}
		req, err := o.createRequest()
		if err != nil {
			return
		}
		checkCreate(t, req)
	})
}

// checkCreate checks a create request the option parser let through.
func checkCreate(t *testing.T, req *csisupdv1.VolumeCreateRequest) {
	t.Helper()
	if err := volreq.CreateVolume(req); err != nil {
		t.Fatalf("the servers' checks refuse %v: %v", req, err)
	}
	if req.GetId() != "v1" || !ids.ValidPluginID(req.GetPluginId()) || len(req.GetSecrets()) > 0 {
		t.Fatalf("request %v: want volume v1, a plugin id, no secrets", req)
	}
	if n := req.GetCapacityMinBytes(); n != 0 && n < minSize {
		t.Fatalf("size %d below a mebibyte taken", n)
	}
	caps := req.GetCapabilities()
	if len(caps) != 1 || !slices.Contains(slices.Collect(maps.Values(volspec.AccessModes)), caps[0].GetAccessMode()) {
		t.Fatalf("capabilities %v: want one of a known access mode", caps)
	}
}

// elsewhere reports whether v is in a key of opts or in the value of a
// key other than k: an error may quote those.
func elsewhere(opts map[string]string, k, v string) bool {
	for ok, ov := range opts {
		if strings.Contains(ok, v) || (ok != k && strings.Contains(ov, v)) {
			return true
		}
	}
	return false
}

// FuzzEngineContainers feeds an engine's answer to GET /containers/json
// to the reconcile's decoding and choice of live workloads. Every live
// workload is a valid workload id of the plugin's prefix.
func FuzzEngineContainers(f *testing.F) {
	f.Add(`[{"Id":"aaaa","State":"running","Mounts":[{"Type":"volume","Name":"v1"}]},{"Id":"bbbb","State":"exited"}]`)
	f.Add(`[{"Id":"../x","State":"running"},{"Id":"","State":"created","Mounts":[{"Type":"volume","Name":"v1"}]}]`)
	f.Add(`[]`)
	vols := []*csisupdv1.Volume{{Id: "v1", Claims: []*csisupdv1.VolumeClaim{
		{NodeId: "n1", WorkloadId: WorkloadPrefix + "cccc", Owner: Owner},
		{NodeId: "n1", WorkloadId: "systemd-web", Owner: "systemd"},
	}}}
	f.Fuzz(func(t *testing.T, body string) {
		var cs []engineContainer
		if json.Unmarshal([]byte(body), &cs) != nil {
			return
		}
		live := liveWorkloads(cs, vols, "n1")
		if !slices.IsSorted(live) {
			t.Fatalf("live workloads %v not sorted", live)
		}
		for _, w := range live {
			if !strings.HasPrefix(w, WorkloadPrefix) || !ids.ValidPathID(w) {
				t.Fatalf("live workload %q: not a valid workload id of prefix %s", w, WorkloadPrefix)
			}
		}
	})
}
