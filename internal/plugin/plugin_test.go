package plugin

import (
	"testing"
	"time"
	"unicode/utf8"
)

func TestWireString(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"csi.example.com", "csi.example.com"},
		{"café ☃", "café ☃"},
		{"caf\xe9", `caf\xe9`},
		{"\xff\xfe", `\xff\xfe`},
		{"ok\xed\xa0\x80end", `ok\xed\xa0\x80end`}, // a UTF-16 surrogate is not UTF-8
	}
	for _, tt := range tests {
		got := WireString(tt.in)
		if got != tt.want || !utf8.ValidString(got) {
			t.Errorf("WireString(%q) = %q, want %q (valid UTF-8)", tt.in, got, tt.want)
		}
	}
}

func TestEventProto(t *testing.T) {
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	e := Event{Index: 7, Time: at, Type: EventHealthy, PluginID: "caf\xe9", Description: "ok"}
	m := e.Proto()
	if m.GetIndex() != 7 || !m.GetTime().AsTime().Equal(at) || m.GetType() != "plugin-healthy" ||
		m.GetPluginId() != `caf\xe9` || m.GetDescription() != "ok" {
		t.Errorf("Proto() = %v", m)
	}
}
