package csiclient

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/secrets"
)

// secretMessages returns every message of the CSI spec with a field marked
// csi_secret.
func secretMessages(t *testing.T) []protoreflect.MessageDescriptor {
	t.Helper()
	var out []protoreflect.MessageDescriptor
	var walk func(protoreflect.MessageDescriptors)
	walk = func(mds protoreflect.MessageDescriptors) {
		for i := 0; i < mds.Len(); i++ {
			md := mds.Get(i)
			fields := md.Fields()
			for j := 0; j < fields.Len(); j++ {
				if secrets.IsSecretField(fields.Get(j)) {
					out = append(out, md)
					break
				}
			}
			walk(md.Messages())
		}
	}
	walk(csi.File_csi_proto.Messages())
	if len(out) < 10 {
		t.Fatalf("found %d CSI messages with secrets; the csi_secret option is not being read", len(out))
	}
	return out
}

func TestRedactEveryCSISecret(t *testing.T) {
	for _, md := range secretMessages(t) {
		t.Run(string(md.Name()), func(t *testing.T) {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
			if err != nil {
				t.Fatal(err)
			}
			m := mt.New()
			var values []string
			fields := md.Fields()
			for j := 0; j < fields.Len(); j++ {
				fd := fields.Get(j)
				if !secrets.IsSecretField(fd) {
					continue
				}
				if !fd.IsMap() || fd.MapValue().Kind() != protoreflect.StringKind {
					t.Fatalf("secret field %s is not a map<string,string>; extend this test", fd.FullName())
				}
				v := fmt.Sprintf("value-of-%s", fd.Name())
				m.Mutable(fd).Map().Set(protoreflect.ValueOfString("key").MapKey(), protoreflect.ValueOfString(v))
				values = append(values, v)
			}
			// Wrapped in a ClientCSI request when one exists, to check the
			// walk goes into nested messages.
			msg := m.Interface()
			if md.FullName() == "csi.v1.CreateVolumeRequest" {
				msg = &csisupdv1.ControllerCreateVolumeRequest{PluginId: "p", Request: msg.(*csi.CreateVolumeRequest)}
			}
			before := protojson.Format(msg)

			red := Redact(msg)
			out := protojson.Format(red)
			for _, v := range values {
				if strings.Contains(out, v) {
					t.Errorf("redacted message still has %q: %s", v, out)
				}
			}
			if !strings.Contains(out, `"key"`) || !strings.Contains(out, Redacted) {
				t.Errorf("redacted message lost the secret's key or the marker: %s", out)
			}
			if got := protojson.Format(msg); got != before {
				t.Errorf("Redact changed its argument:\nbefore %s\nafter  %s", before, got)
			}
			if got := SecretValues(msg); !slices.Equal(sorted(got), sorted(values)) {
				t.Errorf("SecretValues = %v, want %v", got, values)
			}
		})
	}
}

func TestRedactKeepsEverythingElse(t *testing.T) {
	req := &csi.CreateVolumeRequest{
		Name:       "vol",
		Parameters: map[string]string{"type": "fast"},
		Secrets:    map[string]string{"a": "1", "b": "2"},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	}
	got := Redact(req).(*csi.CreateVolumeRequest)
	want := proto.Clone(req).(*csi.CreateVolumeRequest)
	want.Secrets = map[string]string{"a": Redacted, "b": Redacted}
	if !proto.Equal(got, want) {
		t.Errorf("Redact = %v, want %v", got, want)
	}
}

func TestRedactNil(t *testing.T) {
	if got := Redact(nil); got != nil {
		t.Errorf("Redact(nil) = %v", got)
	}
	var typedNil *csi.DeleteVolumeRequest
	if got := Redact(typedNil); got.ProtoReflect().IsValid() {
		t.Errorf("Redact(typed nil) = %v, want an invalid message", got)
	}
	if got := SecretValues(typedNil); got != nil {
		t.Errorf("SecretValues(typed nil) = %v", got)
	}
}

func TestRedactString(t *testing.T) {
	req := &csi.DeleteVolumeRequest{VolumeId: "v", Secrets: map[string]string{"user": "alice-secret", "empty": ""}}
	tests := []struct{ in, want string }{
		{"login alice-secret failed", "login " + Redacted + " failed"},
		{"nothing to hide", "nothing to hide"},
		{"alice-secretalice-secret", Redacted + Redacted},
	}
	for _, tt := range tests {
		if got := RedactString(tt.in, req); got != tt.want {
			t.Errorf("RedactString(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
