package plugin

import (
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

func TestVolumeCondition(t *testing.T) {
	if abnormal, msg := VolumeCondition(&csi.VolumeHealth{VolumeId: "v"}); abnormal || msg != "" {
		t.Errorf("no statuses: %v %q, want normal", abnormal, msg)
	}
	h := &csi.VolumeHealth{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{
		{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: "Abnormal", Message: "disk slow"},
		{Status: csi.VolumeHealthErrorType_INACCESSIBLE},
	}}
	if abnormal, msg := VolumeCondition(h); !abnormal || msg != "DEGRADED Abnormal: disk slow; INACCESSIBLE" {
		t.Errorf("two statuses: %v %q", abnormal, msg)
	}
	long := &csi.VolumeHealth{HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Message: strings.Repeat("é", MaxConditionMessage)}}}
	if _, msg := VolumeCondition(long); len(msg) > MaxConditionMessage || !strings.HasPrefix(msg, "UNKNOWN") {
		t.Errorf("a long message is %d bytes, want at most %d", len(msg), MaxConditionMessage)
	}
}
