package deploy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that Prometheus' query engine, which the alert tests
// run, leaves no goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
