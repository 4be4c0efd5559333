//go:build nemesis

package nemesis

import (
	"flag"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// The binaries TestMain builds.
var (
	csisupdBin    string
	testPluginBin string
)

// seedFlag is -seed (make nemesis SEED=N): Options.Seed when a test gives
// none.
var seedFlag = flag.Int64("seed", 0, "seed of the fault schedule (0: from the clock, logged)")

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m,
		// The agent is the code under test: with -race it runs with the
		// race detector too. The plugin is a tool.
		testutil.Binary{Pkg: "github.com/csisupd/csisupd/cmd/csisupd", Race: raceEnabled, Path: &csisupdBin},
		testutil.Binary{Pkg: "github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin", Path: &testPluginBin})
}
