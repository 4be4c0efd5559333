package statepb_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestSameWireLayout compares each storage message with the public
// message it was split from, field by field and recursively: the same
// field numbers with the same names, kinds, cardinalities, packing and
// oneofs, and for enums the same numbers. Messages of other packages
// (google.protobuf.Timestamp) must be the same message. The messages that
// left the public API are compared as the record of them has them.
func TestSameWireLayout(t *testing.T) {
	seen := map[protoreflect.FullName]bool{}
	for _, c := range conversions {
		compareMessages(t, c.api.Descriptor(), c.stored.Descriptor(), seen)
	}
	for _, o := range oldStored(t) {
		compareMessages(t, o.old.Descriptor(), o.stored.Descriptor(), seen)
	}
}

func compareMessages(t *testing.T, api, st protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
	t.Helper()
	if seen[st.FullName()] {
		return
	}
	seen[st.FullName()] = true
	shared := 0
	for i := range st.Fields().Len() {
		if !storageOnlyField(st.Fields().Get(i)) {
			shared++
		}
	}
	public := 0
	for i := range api.Fields().Len() {
		if !apiOnlyFields[api.Fields().Get(i).FullName()] {
			public++
		}
	}
	if public != shared {
		t.Errorf("%s has %d fields, %s %d", api.FullName(), public, st.FullName(), shared)
	}
	for i := range st.Fields().Len() {
		if sf := st.Fields().Get(i); api.Fields().ByNumber(sf.Number()) == nil && !storageOnlyField(sf) {
			t.Errorf("%s has field %d (%s), %s has none", st.FullName(), sf.Number(), sf.Name(), api.FullName())
		}
	}
	for i := range api.Fields().Len() {
		af := api.Fields().Get(i)
		sf := st.Fields().ByNumber(af.Number())
		if apiOnlyFields[af.FullName()] {
			if sf != nil {
				t.Errorf("%s is never stored, but %s uses its number %d", af.FullName(), st.FullName(), af.Number())
			}
			continue
		}
		if sf == nil {
			t.Errorf("%s has field %d (%s), %s has none", api.FullName(), af.Number(), af.Name(), st.FullName())
			continue
		}
		if d := fieldDifference(af, sf); d != "" {
			t.Errorf("field %d: %s is %s", af.Number(), af.FullName(), d)
			continue
		}
		switch {
		case af.IsMap():
			compareMessages(t, af.Message(), sf.Message(), seen)
		case af.Message() != nil:
			compareNested(t, af.Message(), sf.Message(), seen)
		case af.Enum() != nil:
			compareEnums(t, af.Enum(), sf.Enum())
		}
	}
}

// compareNested compares the messages of two message fields: a message of
// the public package must have its own storage message, anything else
// must be the same message.
func compareNested(t *testing.T, api, st protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
	t.Helper()
	if api.ParentFile().Package() == "csisupd.v1" {
		if st.ParentFile().Package() != "csisupd.state.v1" {
			t.Errorf("%s is stored as %s, not as a message of the storage package", api.FullName(), st.FullName())
			return
		}
		compareMessages(t, api, st, seen)
		return
	}
	if api.FullName() != st.FullName() {
		t.Errorf("%s is stored as %s", api.FullName(), st.FullName())
	}
}

func compareEnums(t *testing.T, api, st protoreflect.EnumDescriptor) {
	t.Helper()
	if api.Values().Len() != st.Values().Len() {
		t.Errorf("enum %s has %d values, %s %d", api.FullName(), api.Values().Len(), st.FullName(), st.Values().Len())
	}
	for i := range api.Values().Len() {
		av := api.Values().Get(i)
		if sv := st.Values().ByNumber(av.Number()); sv == nil || sv.Name() != av.Name() {
			t.Errorf("enum %s value %s = %d has no equal in %s", api.FullName(), av.Name(), av.Number(), st.FullName())
		}
	}
}

// fieldDifference describes how sf differs from af on the wire or in
// name; empty when it does not.
func fieldDifference(af, sf protoreflect.FieldDescriptor) string {
	switch {
	case af.Name() != sf.Name():
		return fmt.Sprintf("named %s in the storage message", sf.Name())
	case af.Kind() != sf.Kind():
		return fmt.Sprintf("a %s, stored as a %s", af.Kind(), sf.Kind())
	case af.Cardinality() != sf.Cardinality() || af.IsMap() != sf.IsMap():
		return fmt.Sprintf("%s, stored as %s", af.Cardinality(), sf.Cardinality())
	case af.IsPacked() != sf.IsPacked():
		return fmt.Sprintf("packed %v, stored packed %v", af.IsPacked(), sf.IsPacked())
	case af.HasPresence() != sf.HasPresence():
		return fmt.Sprintf("with presence %v, stored with presence %v", af.HasPresence(), sf.HasPresence())
	case oneofName(af) != oneofName(sf):
		return fmt.Sprintf("in oneof %q, stored in oneof %q", oneofName(af), oneofName(sf))
	}
	return ""
}

func oneofName(fd protoreflect.FieldDescriptor) protoreflect.Name {
	if od := fd.ContainingOneof(); od != nil {
		return od.Name()
	}
	return ""
}

// TestOldEncodingDecodes encodes fully populated public messages as the
// releases before the storage format did (every command of a log entry,
// a snapshot, and each row), decodes the bytes as the storage message, and
// requires no field left unknown and, for a row, what the converter makes
// of the public message. The other way too: what a newer server writes,
// an older one reads, as the message it wrote.
func TestOldEncodingDecodes(t *testing.T) {
	for _, c := range conversions {
		for v := range variants(c.api) {
			api := full(c.api, v)
			what := fmt.Sprintf("%s (case %d)", name(c.api), v)
			st := decodesLosslessly(t, what, mustMarshal(t, api), c.api, c.stored)
			if want := c.fromAPI(api); !proto.Equal(st, want) {
				t.Errorf("%s decoded as %s:\n got  %v\n want %v", what, c.stored.Descriptor().FullName(), st, want)
			}
		}
	}
	for _, o := range oldStored(t) {
		for v := range variants(o.old) {
			decodesLosslessly(t, fmt.Sprintf("old %s (case %d)", name(o.old), v), mustMarshal(t, full(o.old, v)), o.old, o.stored)
		}
	}
}

// decodesLosslessly decodes b, the encoding of a message of type old, as
// the storage message type st, and requires no field of either decoding to
// be unknown and the storage message, encoded again, to decode as old to
// what b does: the storage message keeps every field b holds. It returns
// the storage message.
func decodesLosslessly(t *testing.T, what string, b []byte, old, st protoreflect.MessageType) proto.Message {
	t.Helper()
	stored := decodeKnown(t, what, b, st)
	want := decodeKnown(t, what, b, old)
	back := decodeKnown(t, what+" re-encoded from storage", mustMarshal(t, stored), old)
	if !proto.Equal(back, want) {
		t.Errorf("%s re-encoded from storage decodes as\n %v\nnot\n %v", what, back, want)
	}
	return stored
}

// decodeKnown decodes b as a message of type typ and requires it to keep
// no unknown field.
func decodeKnown(t *testing.T, what string, b []byte, typ protoreflect.MessageType) proto.Message {
	t.Helper()
	m := typ.New().Interface()
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatalf("%s: decode as %s: %v", what, typ.Descriptor().FullName(), err)
	}
	if u := unknownFields(m.ProtoReflect()); u != "" {
		t.Errorf("%s: decoded as %s with unknown fields in %s", what, typ.Descriptor().FullName(), u)
	}
	return m
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("encode %T: %v", m, err)
	}
	return b
}

// unknownFields returns the name of the first message under m (m
// included) that holds unknown fields, or "".
func unknownFields(m protoreflect.Message) string {
	if len(m.GetUnknown()) > 0 {
		return string(m.Descriptor().FullName())
	}
	var found string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && found == ""; i++ {
				found = unknownFields(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, e protoreflect.Value) bool {
				found = unknownFields(e.Message())
				return found == ""
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			found = unknownFields(v.Message())
		}
		return found == ""
	})
	return found
}

// TestAPIHoldsNoStorageMessage requires the public API to hold no message
// of the storage format, under the name the storage format gives it: no
// raft log entry or batch, no snapshot, no command of the log and no
// stored record. Nor may a file of the API import one of the storage
// format. The API's messages are what its RPCs carry; a stored one there
// would make users depend on what a data_dir holds.
func TestAPIHoldsNoStorageMessage(t *testing.T) {
	stored := map[protoreflect.Name]bool{}
	for _, f := range storageFiles(t) {
		msgs := f.Messages()
		for i := range msgs.Len() {
			n := msgs.Get(i).Name()
			if n == "LogEntry" || n == "LogBatch" || n == "StateSnapshot" ||
				strings.HasSuffix(string(n), "Command") || strings.HasSuffix(string(n), "Record") {
				stored[n] = true
			}
		}
	}
	for _, n := range []protoreflect.Name{"LogEntry", "LogBatch", "StateSnapshot", "NodePluginsCommand", "NodeStatusCommand", "ACLBootstrapCommand", "ServerRecord", "ACLTokenRecord"} {
		if !stored[n] {
			t.Fatalf("the storage format has no %s: this test looks for the wrong names", n)
		}
	}

	api := (&csisupdv1.ClusterNode{}).ProtoReflect().Descriptor().ParentFile().Package()
	storage := (&statepb.LogEntry{}).ProtoReflect().Descriptor().ParentFile().Package()
	files := 0
	protoregistry.GlobalFiles.RangeFilesByPackage(api, func(f protoreflect.FileDescriptor) bool {
		files++
		imports := f.Imports()
		for i := range imports.Len() {
			if imp := imports.Get(i); imp.Package() == storage {
				t.Errorf("%s imports %s, of the storage format", f.Path(), imp.Path())
			}
		}
		forEachMessage(f.Messages(), func(m protoreflect.MessageDescriptor) {
			if stored[m.Name()] {
				t.Errorf("%s defines %s, a message of the storage format: the servers' raft log, snapshots and rows are package statepb's", f.Path(), m.FullName())
			}
		})
		return true
	})
	if files == 0 {
		t.Fatalf("no file of proto package %s is registered", api)
	}
}

// forEachMessage calls f for every message of msgs and every message
// nested in them.
func forEachMessage(msgs protoreflect.MessageDescriptors, f func(protoreflect.MessageDescriptor)) {
	for i := range msgs.Len() {
		f(msgs.Get(i))
		forEachMessage(msgs.Get(i).Messages(), f)
	}
}
