//go:build package

package pkgtest

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the goroutines waiting on the installed agent end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
