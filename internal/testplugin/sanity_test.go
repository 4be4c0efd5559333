package testplugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
	"k8s.io/klog/v2"
)

// sanitySkips are csi-sanity specs this plugin does not pass, by a
// substring of their full text. It is empty: the plugin passes every spec
// csi-sanity runs for what it advertises. Keep it in sync with the package doc.
var sanitySkips = []string{}

// sanityChildEnv marks the child process that runs the suite; its value is
// the plugin's Config.Mounts, with nodeLocalSuffix for a node-local plugin.
const sanityChildEnv = "TESTPLUGIN_SANITY_CHILD"

// nodeLocalSuffix marks a suite run against a node-local plugin.
const nodeLocalSuffix = "+nodelocal"

// TestSanity runs the csi-sanity suite against a monolith plugin over a real
// unix socket, once with markers and once with bind mounts (when this
// process can mount), with a zone topology; and once more node-local, with
// markers. Ginkgo runs a suite at most once per process and exits the
// process under go test -count > 1, so each suite runs in a child process:
// a fresh copy of this test binary running only this test.
func TestSanity(t *testing.T) {
	if mode := os.Getenv(sanityChildEnv); mode != "" {
		mounts, nodeLocal := strings.CutSuffix(mode, nodeLocalSuffix)
		runSanity(t, mounts, nodeLocal)
		return
	}
	inModes(t, func(t *testing.T, mounts string) { sanityChild(t, mounts, false) })
	t.Run("node-local", func(t *testing.T) { sanityChild(t, MountsMarker, true) })
}

// sanityChild runs the suite in a child process with the given mounts,
// against a node-local plugin when nodeLocal is set.
func sanityChild(t *testing.T, mounts string, nodeLocal bool) {
	if mounts == MountsBind {
		skipWithoutMounts(t)
	}
	mode := mounts
	if nodeLocal {
		mode += nodeLocalSuffix
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSanity$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), sanityChildEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("csi-sanity failed (%v):\n%s", err, out)
	}
	var summary []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, summaryPrefix) {
			summary = append(summary, strings.TrimPrefix(line, summaryPrefix))
		}
	}
	if len(summary) == 0 {
		t.Fatalf("csi-sanity printed no summary:\n%s", out)
	}
	t.Log("\n" + strings.Join(summary, "\n"))
}

// summaryPrefix starts the child's summary lines.
const summaryPrefix = "csi-sanity| "

// runSanity runs the suite in this process; only once per process.
func runSanity(t *testing.T, mounts string, nodeLocal bool) {
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	topology := map[string]string{"topology.testplugin/zone": "z1"}
	if nodeLocal {
		topology = nil
	}
	p, err := New(Config{
		Socket:     filepath.Join(dir, "csi.sock"),
		StateDir:   t.TempDir(),
		NodeID:     "sanity-node",
		MaxVolumes: 4,
		Topology:   topology,
		NodeLocal:  nodeLocal,
		// Everything the plugin can do, so that csi-sanity tests it all.
		ControllerCapabilities: SupportedControllerCapabilities,
		VolumeHealth:           true,
		VolumeMountGroup:       true,
		Mounts:                 mounts,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	// Runs before the directory holding the mounts is removed.
	t.Cleanup(func() {
		if err := p.UnmountAll(); err != nil {
			t.Errorf("UnmountAll: %v", err)
		}
	})

	cfg := sanity.NewTestConfig()
	cfg.Address = p.Socket()
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	cfg.TestNodeVolumeAttachLimit = true
	cfg.IdempotentCount = 3
	// The modify specs send these; they must be mutable parameters the
	// plugin accepts (DefaultMutableParameters).
	cfg.TestVolumeMutableParameters = map[string]string{"iops": "3000", "tier": "fast"}
	sc := sanity.GinkgoTest(&cfg)
	defer sc.Finalize()

	var summary []string
	ginkgo.ReportAfterSuite("csi-sanity summary", func(r ginkgo.Report) {
		var passed, failed, skipped int
		var failures, skips []string
		for _, s := range r.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			switch {
			case s.State.Is(types.SpecStatePassed):
				passed++
			case s.State.Is(types.SpecStateSkipped | types.SpecStatePending):
				skipped++
				reason := s.Failure.Message
				if s.State.Is(types.SpecStatePending) {
					reason = "disabled in csi-sanity"
				}
				skips = append(skips, fmt.Sprintf("  skipped: %s (%s)", s.FullText(), reason))
			default:
				failed++
				failures = append(failures, fmt.Sprintf("%s: %s", s.FullText(), s.Failure.Message))
			}
		}
		summary = append(summary, fmt.Sprintf("csi-sanity: %d passed, %d failed, %d skipped", passed, failed, skipped))
		slices.Sort(skips)
		summary = append(summary, failures...)
		summary = append(summary, skips...)
	})

	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = sanitySkips
	reporter.Succinct = true
	reporter.NoColor = true
	// csi-sanity logs every cleanup through klog; the summary is enough.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	ok := ginkgo.RunSpecs(t, "csi-sanity against testplugin", suite, reporter)
	fmt.Println() // Ginkgo's succinct report does not end its line.
	for _, line := range summary {
		fmt.Println(summaryPrefix + line)
	}
	if !ok {
		t.Fatal("csi-sanity failed; see the summary above")
	}
}
