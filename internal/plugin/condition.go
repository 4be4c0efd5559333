package plugin

import (
	"strings"
	"unicode/utf8"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// MaxConditionMessage caps the message of a volume condition: it comes
// from a plugin, and is stored and shown.
const MaxConditionMessage = 1024

// VolumeCondition summarises what a plugin reported of a volume's health
// (ControllerGetVolumeHealth, ControllerListVolumeHealth,
// NodeGetVolumeHealth): abnormal when it lists any status, each as
// "STATUS reason: message", capped at MaxConditionMessage. A nil report is
// healthy.
func VolumeCondition(h *csi.VolumeHealth) (abnormal bool, message string) {
	var parts []string
	for _, st := range h.GetHealthStatuses() {
		p := st.GetStatus().String()
		if r := st.GetReason(); r != "" {
			p += " " + r
		}
		if m := st.GetMessage(); m != "" {
			p += ": " + m
		}
		parts = append(parts, p)
	}
	return len(parts) > 0, CapConditionMessage(strings.Join(parts, "; "))
}

// CapConditionMessage cuts s to MaxConditionMessage bytes at a rune
// boundary.
func CapConditionMessage(s string) string {
	if len(s) <= MaxConditionMessage {
		return s
	}
	s = s[:MaxConditionMessage]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
