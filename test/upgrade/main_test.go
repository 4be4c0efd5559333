package upgrade

import (
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// binary is the csisupd binary of the code under test, built by TestMain.
var binary string

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m, testutil.Binary{Pkg: "github.com/csisupd/csisupd/cmd/csisupd", Path: &binary})
}
