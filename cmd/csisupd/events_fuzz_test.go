package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// FuzzEventEncoding follows one registry event the whole way to the
// operator: the API message the agent builds, its wire encoding, and the
// line `csisupd events` prints, in JSON and as text. Whatever the event
// holds: nothing panics, the message always marshals (proto3 strings must
// be UTF-8), the JSON line is one valid object with the event's values,
// and the text line is one line with no raw control or format character.
func FuzzEventEncoding(f *testing.F) {
	f.Add(uint64(1), int64(1767323045000000000), "plugin-registered", "p1", "plugin registered at /var/lib/csisupd/plugins/p1/csi.sock")
	f.Add(uint64(1<<63), int64(-1), "plugin-healthy", hostile, "\x1b]0;title\a\r\n\u202e\u2066")
	f.Add(uint64(0), int64(1<<62), "", "caf\xe9", "bad \xff\xfe utf8 \xed\xa0\x80 surrogate")
	f.Fuzz(func(t *testing.T, index uint64, unixNano int64, typ, pluginID, desc string) {
		e := plugin.Event{Index: index, Time: time.Unix(0, unixNano), Type: plugin.EventType(typ), PluginID: pluginID, Description: desc}
		msg := e.Proto()
		wire, err := proto.Marshal(msg)
		if err != nil {
			t.Fatalf("the API message does not marshal: %v", err)
		}
		var got csisupdv1.Event
		if err := proto.Unmarshal(wire, &got); err != nil {
			t.Fatalf("the wire encoding does not unmarshal: %v", err)
		}
		if !proto.Equal(msg, &got) {
			t.Fatalf("round trip changed the message: %v != %v", msg, &got)
		}
		for name, pair := range map[string][2]string{"type": {typ, got.GetType()}, "plugin_id": {pluginID, got.GetPluginId()},
			"description": {desc, got.GetDescription()}} {
			if utf8.ValidString(pair[0]) && pair[0] != pair[1] {
				t.Errorf("valid UTF-8 %s %q arrived as %q", name, pair[0], pair[1])
			}
		}

		var js bytes.Buffer
		if err := printEvent(&js, &got, true); err != nil {
			t.Fatal(err)
		}
		line := js.String()
		if strings.Count(line, "\n") != 1 || !strings.HasSuffix(line, "\n") || !json.Valid([]byte(line)) {
			t.Fatalf("events --json printed %q, want one line of valid JSON", line)
		}
		var decoded csisupdv1.Event
		if err := protojson.Unmarshal([]byte(line), &decoded); err != nil {
			t.Fatalf("JSON line %q does not decode as an Event: %v", line, err)
		}
		if !proto.Equal(&decoded, &got) {
			t.Errorf("JSON line %q decodes to %v, want %v", line, &decoded, &got)
		}
		var raw map[string]any
		if err := json.Unmarshal([]byte(line), &raw); err != nil {
			t.Fatal(err)
		}
		if raw["index"] != strconv.FormatUint(index, 10) {
			t.Errorf("index = %#v, want the string %q", raw["index"], strconv.FormatUint(index, 10))
		}

		var text bytes.Buffer
		if err := printEvent(&text, &got, false); err != nil {
			t.Fatal(err)
		}
		out := text.String()
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
			t.Fatalf("events printed %q, want one line", out)
		}
		if err := terminalSafe(out); err != nil {
			t.Fatal(err)
		}
	})
}
