package statepb_test

import (
	"os"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// oldStoredFile is the record of the public messages that the releases
// before this package stored and that left the public API: LogEntry,
// LogBatch, StateSnapshot, their commands and the server and token
// records, as they were then.
const oldStoredFile = "testdata/stored_public_messages.textproto"

// oldPair is a message of oldStoredFile and the storage message that took
// its place.
type oldPair struct {
	old, stored protoreflect.MessageType
}

// oldStored reads oldStoredFile and returns each of its messages, as a
// dynamic message type, with the storage message of the same name. The
// public messages the old ones hold (ClusterNode, Volume, ...) are the
// API's, which has only added fields to them since.
func oldStored(t *testing.T) []oldPair {
	t.Helper()
	b, err := os.ReadFile(oldStoredFile)
	if err != nil {
		t.Fatal(err)
	}
	fdp := &descriptorpb.FileDescriptorProto{}
	if err := prototext.Unmarshal(b, fdp); err != nil {
		t.Fatalf("%s: %v", oldStoredFile, err)
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatalf("%s: %v", oldStoredFile, err)
	}
	pkg := (&statepb.LogEntry{}).ProtoReflect().Descriptor().ParentFile().Package()
	msgs := fd.Messages()
	pairs := make([]oldPair, 0, msgs.Len())
	for i := range msgs.Len() {
		m := msgs.Get(i)
		st, err := protoregistry.GlobalTypes.FindMessageByName(pkg.Append(m.Name()))
		if err != nil {
			t.Fatalf("%s: message %s has no storage message of its name: %v", oldStoredFile, m.Name(), err)
		}
		pairs = append(pairs, oldPair{old: dynamicpb.NewMessageType(m), stored: st})
	}
	if len(pairs) != 8 {
		t.Fatalf("%s holds %d messages, want the 8 that left the API", oldStoredFile, len(pairs))
	}
	return pairs
}

// oldStoredType returns the old message type of oldStored named name.
func oldStoredType(t *testing.T, name protoreflect.Name) protoreflect.MessageType {
	t.Helper()
	for _, p := range oldStored(t) {
		if p.old.Descriptor().Name() == name {
			return p.old
		}
	}
	t.Fatalf("%s has no message %s", oldStoredFile, name)
	return nil
}
