package statepb_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// conversion is one pair of converters between a public message and its
// storage form, typed away so that one table holds them all.
type conversion struct {
	api, stored protoreflect.MessageType
	fromAPI     func(proto.Message) proto.Message
	toAPI       func(proto.Message) proto.Message
	// nilToNil reports whether both converters turn nil into nil.
	nilToNil func() bool
}

func conv[A, S proto.Message](from func(A) S, to func(S) A) conversion {
	var a A
	var s S
	return conversion{
		api:      a.ProtoReflect().Type(),
		stored:   s.ProtoReflect().Type(),
		fromAPI:  func(m proto.Message) proto.Message { return from(m.(A)) },
		toAPI:    func(m proto.Message) proto.Message { return to(m.(S)) },
		nilToNil: func() bool { return any(from(a)) == any(s) && any(to(s)) == any(a) },
	}
}

// conversions are every pair of converters of the package: the stored
// rows, and the parts of rows, that the services show, each of which is
// also a public message. The storage messages that only old releases kept
// in the public API are compared with that record instead (oldStored).
var conversions = []conversion{
	conv(statepb.ClusterNodeFromAPI, statepb.ClusterNodeToAPI),
	conv(statepb.PluginFromAPI, statepb.PluginToAPI),
	conv(statepb.VolumeFromAPI, statepb.VolumeToAPI),
	conv(statepb.VolumeCapabilityFromAPI, statepb.VolumeCapabilityToAPI),
	conv(statepb.VolumeClaimFromAPI, statepb.VolumeClaimToAPI),
	conv(statepb.VolumeUsageFromAPI, statepb.VolumeUsageToAPI),
	conv(statepb.TopologySegmentFromAPI, statepb.TopologySegmentToAPI),
	conv(statepb.VolumeContentSourceFromAPI, statepb.VolumeContentSourceToAPI),
	conv(statepb.VolumeExpansionFromAPI, statepb.VolumeExpansionToAPI),
	conv(statepb.VolumeConditionFromAPI, statepb.VolumeConditionToAPI),
	conv(statepb.ACLPolicyFromAPI, statepb.ACLPolicyToAPI),
}

// storageOnly are the messages of the storage format that no public
// message was ever stored as: the typed volume commands and the volume
// snapshots. They have no
// public form, so no conversion, and the log entry's fields that hold them
// are skipped where the storage messages are compared with the public
// ones.
var storageOnly = map[protoreflect.FullName]bool{
	"csisupd.state.v1.VolumeCreateCommand":   true,
	"csisupd.state.v1.VolumeDeleteCommand":   true,
	"csisupd.state.v1.ClaimTakeCommand":      true,
	"csisupd.state.v1.ClaimStepCommand":      true,
	"csisupd.state.v1.ClaimRemoveCommand":    true,
	"csisupd.state.v1.VolumeExpandCommand":   true,
	"csisupd.state.v1.VolumeModifyCommand":   true,
	"csisupd.state.v1.SnapshotPutCommand":    true,
	"csisupd.state.v1.SnapshotDeleteCommand": true,
	// The operator's commands of availability and drain came later.
	"csisupd.state.v1.VolumeAvailabilityCommand": true,
	"csisupd.state.v1.PluginDrainCommand":        true,
	"csisupd.state.v1.VolumeHealthCommand":       true,
	// Node secrets came later still.
	"csisupd.state.v1.NodeRekeyCommand": true,
	// Volume snapshots came with the typed commands; they are shown
	// through VolumeSnapshotView.
	"csisupd.state.v1.VolumeSnapshot": true,
}

// storageOnlyFields are the fields of stored messages that never leave
// the servers, so their public forms lack them: the hash of a node's
// secret.
var storageOnlyFields = map[protoreflect.FullName]bool{
	"csisupd.state.v1.ClusterNode.secret_hash": true,
	// The term of the leader that took a claim.
	"csisupd.state.v1.VolumeClaim.leader_term": true,
}

// apiOnlyFields are the fields of public messages that are never
// stored: the leader fills them from its memory (a lease's last renewal
// and deadline). Their numbers stay free in the storage message.
var apiOnlyFields = map[protoreflect.FullName]bool{
	"csisupd.v1.VolumeClaim.lease_renewed_at": true,
	"csisupd.v1.VolumeClaim.lease_deadline":   true,
}

// storageOnlyField reports whether a field of a storage message holds a
// storage-only message or is itself storage-only.
func storageOnlyField(fd protoreflect.FieldDescriptor) bool {
	return storageOnlyFields[fd.FullName()] || fd.Message() != nil && storageOnly[fd.Message().FullName()]
}

// storageOnlyVariant reports whether fill's variant v of a storage message
// type sets a storage-only field of a oneof.
func storageOnlyVariant(t protoreflect.MessageType, v int) bool {
	oneofs := t.Descriptor().Oneofs()
	for i := range oneofs.Len() {
		if fields := oneofs.Get(i).Fields(); storageOnlyField(fields.Get(v % fields.Len())) {
			return true
		}
	}
	return false
}

// clearStorageOnly clears the fields of m, outside oneofs, that hold
// storage-only messages, and the storage-only fields of the messages m
// holds: they have no public form to convert to.
func clearStorageOnly(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		switch {
		case storageOnlyFields[fd.FullName()] || fd.ContainingOneof() == nil && storageOnlyField(fd):
			m.Clear(fd)
		case fd.Message() == nil || fd.IsMap() || !m.Has(fd):
		case fd.IsList():
			list := m.Get(fd).List()
			for j := range list.Len() {
				clearStorageOnly(list.Get(j).Message())
			}
		default:
			clearStorageOnly(m.Get(fd).Message())
		}
	}
}

func name(t protoreflect.MessageType) string { return string(t.Descriptor().Name()) }

// variants returns the number of values of a message type fill makes:
// one per case of its largest oneof.
func variants(t protoreflect.MessageType) int {
	n := 1
	oneofs := t.Descriptor().Oneofs()
	for i := range oneofs.Len() {
		n = max(n, oneofs.Get(i).Fields().Len())
	}
	return n
}

// full returns a new message of type t with every field set to a value
// that is not zero, recursively: lists have two elements, maps two
// entries, and each oneof holds its case number choice (modulo its size).
// Values differ from field to field, so a converter that swaps two fields
// of a type is caught too.
func full(t protoreflect.MessageType, choice int) proto.Message {
	m := t.New()
	fill(m, choice, 0)
	return m.Interface()
}

func fill(m protoreflect.Message, choice, depth int) {
	if depth > 10 {
		panic(fmt.Sprintf("fill: %s nests too deep", m.Descriptor().FullName()))
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() && od.Fields().Get(choice%od.Fields().Len()) != fd {
			continue
		}
		// Never stored, so never in what a conversion starts from.
		if apiOnlyFields[fd.FullName()] {
			continue
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for j := range 2 {
				if fd.Message() != nil {
					e := l.NewElement()
					fill(e.Message(), j, depth+1)
					l.Append(e)
				} else {
					l.Append(scalar(fd, j))
				}
			}
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for j := range 2 {
				k := scalar(fd.MapKey(), j).MapKey()
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					fill(v.Message(), j, depth+1)
					mp.Set(k, v)
				} else {
					mp.Set(k, scalar(fd.MapValue(), j))
				}
			}
		case fd.Message() != nil:
			fill(m.Mutable(fd).Message(), 0, depth+1)
		default:
			m.Set(fd, scalar(fd, 0))
		}
	}
}

// scalar returns a value for a field that is not zero and depends on the
// field's number and j.
func scalar(fd protoreflect.FieldDescriptor, j int) protoreflect.Value {
	n := int64(fd.Number())*10 + int64(j) + 1
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(j == 0) // two map keys need two values
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), j))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(fmt.Sprintf("%s-%d", fd.Name(), j)))
	case protoreflect.EnumKind:
		vals := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vals.Get((j + 1) % vals.Len()).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(n)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(n))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n))
	}
	panic(fmt.Sprintf("scalar: field %s has kind %s", fd.FullName(), fd.Kind()))
}

// TestRoundTripIsLossless converts every public message with every field
// set to its storage form and back, and every storage message to its
// public form and back, and requires the value it started with. A field
// added to either side without a converter change fails it (tried by
// adding a field to the storage Volume only: "VolumeToAPI(VolumeFromAPI)"
// passed and "VolumeFromAPI(VolumeToAPI)" failed, naming Volume).
func TestRoundTripIsLossless(t *testing.T) {
	for _, c := range conversions {
		for v := range variants(c.api) {
			api := full(c.api, v)
			if got := c.toAPI(c.fromAPI(api)); !proto.Equal(api, got) {
				t.Errorf("%sToAPI(%[1]sFromAPI(x)) != x for case %d:\n x   = %v\n got = %v", name(c.api), v, api, got)
			}
		}
		for v := range variants(c.stored) {
			if storageOnlyVariant(c.stored, v) {
				continue
			}
			st := full(c.stored, v)
			clearStorageOnly(st.ProtoReflect())
			if got := c.fromAPI(c.toAPI(st)); !proto.Equal(st, got) {
				t.Errorf("%sFromAPI(%[1]sToAPI(x)) != x for case %d:\n x   = %v\n got = %v", name(c.stored), v, st, got)
			}
		}
	}
}

// TestEveryStoredMessageIsCompared requires every message of the storage
// format to have a conversion, so that the round-trip test covers it, or
// to be one of the public messages old releases stored (oldStored), or to
// be storage-only: a new storage message must be put in one of the three.
func TestEveryStoredMessageIsCompared(t *testing.T) {
	have := map[protoreflect.FullName]bool{}
	for _, c := range conversions {
		have[c.stored.Descriptor().FullName()] = true
	}
	for _, o := range oldStored(t) {
		have[o.stored.Descriptor().FullName()] = true
	}
	n := 0
	for _, f := range storageFiles(t) {
		msgs := f.Messages()
		for i := range msgs.Len() {
			n++
			if name := msgs.Get(i).FullName(); !have[name] && !storageOnly[name] {
				t.Errorf("storage message %s has no conversion in the table of this test, is not one that old releases stored as a public message, and is not storage-only", name)
			}
		}
	}
	if n == 0 {
		t.Fatal("found no storage message")
	}
}

// storageFiles returns the .proto files of the storage format: every file
// of its proto package.
func storageFiles(t *testing.T) []protoreflect.FileDescriptor {
	t.Helper()
	pkg := (&statepb.LogEntry{}).ProtoReflect().Descriptor().ParentFile().Package()
	var files []protoreflect.FileDescriptor
	protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(f protoreflect.FileDescriptor) bool {
		files = append(files, f)
		return true
	})
	if len(files) == 0 {
		t.Fatalf("no file of proto package %s is registered", pkg)
	}
	return files
}

func TestNilConvertsToNil(t *testing.T) {
	for _, c := range conversions {
		if !c.nilToNil() {
			t.Errorf("the converters of %s do not turn nil into nil", name(c.api))
		}
	}
}

// TestConversionCopies changes every map, list and message reachable from
// a FromAPI converter's result and requires its input to be unchanged: a
// stored row must not alias a message a caller holds and may change. (The
// ToAPI converters share a row's maps, lists and timestamps: rows are
// never changed once stored, and the answers made from them are only
// encoded.)
func TestConversionCopies(t *testing.T) {
	for _, c := range conversions {
		for v := range variants(c.api) {
			api := full(c.api, v)
			before := proto.Clone(api)
			scribble(c.fromAPI(api).ProtoReflect())
			if !proto.Equal(api, before) {
				t.Errorf("%sFromAPI returned a value sharing parts with its input (case %d)", name(c.api), v)
			}
		}
	}
}

// scribble changes every value reachable from m in place.
func scribble(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if fd.Message() != nil {
					scribble(l.Get(i).Message())
				} else {
					l.Set(i, other(fd, l.Get(i)))
				}
			}
		case fd.IsMap():
			mp := v.Map()
			mp.Range(func(k protoreflect.MapKey, e protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					scribble(e.Message())
				} else {
					mp.Set(k, other(fd.MapValue(), e))
				}
				return true
			})
		case fd.Message() != nil:
			scribble(v.Message())
		default:
			m.Set(fd, other(fd, v))
		}
		return true
	})
}

// other returns a value of fd's kind that differs from v.
func other(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.String() + "~")
	case protoreflect.BytesKind:
		// In place, as an alias would see it.
		b := v.Bytes()
		for i := range b {
			b[i]++
		}
		return protoreflect.ValueOfBytes(b)
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!v.Bool())
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(v.Enum() + 1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(v.Int()) + 1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(v.Int() + 1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(v.Uint()) + 1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(v.Uint() + 1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(v.Float()) + 1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(v.Float() + 1)
	}
	panic(fmt.Sprintf("other: field %s has kind %s", fd.FullName(), fd.Kind()))
}

// TestStorageDoesNotImportTheAPI checks that the storage format's .proto
// files import only each other and protobuf's well-known types: the
// storage format must not change with the public one.
func TestStorageDoesNotImportTheAPI(t *testing.T) {
	for _, f := range storageFiles(t) {
		imports := f.Imports()
		for i := range imports.Len() {
			imp := imports.Get(i)
			if imp.Package() != f.Package() && imp.Package() != "google.protobuf" {
				t.Errorf("%s imports %s (package %s)", f.Path(), imp.Path(), imp.Package())
			}
		}
	}
}

// TestACLTokenView requires the API's view of a stored token to carry
// every field of the record that the public token has, by name, and
// never a secret: a field added to both messages and not to the view
// fails it.
func TestACLTokenView(t *testing.T) {
	if statepb.ACLTokenView(nil) != nil {
		t.Error("ACLTokenView(nil) is not nil")
	}
	rec := full((&statepb.ACLTokenRecord{}).ProtoReflect().Type(), 0).(*statepb.ACLTokenRecord)
	view := statepb.ACLTokenView(rec).ProtoReflect()
	recFields := rec.ProtoReflect().Descriptor().Fields()
	fields := view.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.Name() == "secret_id" {
			if view.Has(fd) {
				t.Errorf("the view of a stored token has a secret id")
			}
			continue
		}
		rf := recFields.ByName(fd.Name())
		if rf == nil {
			t.Errorf("the public token's field %s is not in the record: decide how the view fills it", fd.Name())
			continue
		}
		if !view.Get(fd).Equal(rec.ProtoReflect().Get(rf)) {
			t.Errorf("the view's %s is %v, the record's %v", fd.Name(), view.Get(fd), rec.ProtoReflect().Get(rf))
		}
	}
	scribble(view)
	if !proto.Equal(rec, full(rec.ProtoReflect().Type(), 0)) {
		t.Error("ACLTokenView returned a value sharing parts with its input")
	}
}

// TestListConverters requires each list converter to convert every element
// as the converter of one element does, in order, and nil to nil.
func TestListConverters(t *testing.T) {
	checkList(t, "PluginsFromAPI", statepb.PluginsFromAPI, statepb.PluginFromAPI)
	checkList(t, "PluginsToAPI", statepb.PluginsToAPI, statepb.PluginToAPI)
	checkList(t, "ClusterNodesToAPI", statepb.ClusterNodesToAPI, statepb.ClusterNodeToAPI)
	checkList(t, "VolumesToAPI", statepb.VolumesToAPI, statepb.VolumeToAPI)
	checkList(t, "VolumeCapabilitiesFromAPI", statepb.VolumeCapabilitiesFromAPI, statepb.VolumeCapabilityFromAPI)
	checkList(t, "ACLPoliciesToAPI", statepb.ACLPoliciesToAPI, statepb.ACLPolicyToAPI)
}

func checkList[In, Out proto.Message](t *testing.T, name string, list func([]In) []Out, one func(In) Out) {
	t.Helper()
	var zero In
	typ := zero.ProtoReflect().Type()
	in := []In{full(typ, 0).(In), full(typ, 1).(In)}
	got := list(in)
	if len(got) != len(in) {
		t.Fatalf("%s: %d elements, want %d", name, len(got), len(in))
	}
	for i := range in {
		if want := one(in[i]); !proto.Equal(got[i], want) {
			t.Errorf("%s: element %d is %v, want %v", name, i, got[i], want)
		}
	}
	if list(nil) != nil {
		t.Errorf("%s: nil converts to a non-nil list", name)
	}
}
