package dockerplugin

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestIsNotFoundThroughCallError checks that a volume's NotFound is still
// seen once turned into advice for the engine (a Get of an unknown volume
// is logged at debug), and a plugin's NotFound is not one.
func TestIsNotFoundThroughCallError(t *testing.T) {
	if err := clusterError("get volume", status.Error(codes.NotFound, "volume v1 not found")); !isNotFound(err) {
		t.Errorf("isNotFound(%v) = false, want true", err)
	}
	if err := clusterError("get volume", status.Error(codes.Unavailable, "no leader")); isNotFound(err) {
		t.Errorf("isNotFound(%v) = true, want false", err)
	}
}
