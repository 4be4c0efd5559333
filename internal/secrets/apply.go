package secrets

import (
	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ClassOf returns the class whose block a CSI request takes its secrets
// from. A request of no listed class takes the default block.
func ClassOf(req proto.Message) Class {
	switch req.(type) {
	case *csi.CreateVolumeRequest, *csi.DeleteVolumeRequest,
		*csi.ControllerPublishVolumeRequest, *csi.ControllerUnpublishVolumeRequest,
		*csi.ValidateVolumeCapabilitiesRequest, *csi.ControllerExpandVolumeRequest,
		*csi.ControllerModifyVolumeRequest:
		return Controller
	case *csi.CreateSnapshotRequest, *csi.DeleteSnapshotRequest, *csi.ListSnapshotsRequest, *csi.GetSnapshotRequest:
		return Snapshot
	case *csi.NodeStageVolumeRequest:
		return NodeStage
	case *csi.NodePublishVolumeRequest:
		return NodePublish
	case *csi.NodeExpandVolumeRequest:
		return NodeExpand
	}
	return Default
}

// IsSecretField reports whether CSI marks fd as secret (csi.v1.csi_secret).
func IsSecretField(fd protoreflect.FieldDescriptor) bool {
	opts := fd.Options()
	if opts == nil {
		return false
	}
	secret, _ := proto.GetExtension(opts, csi.E_CsiSecret).(bool)
	return secret
}

// secretsField returns the field of m's message that CSI marks secret and
// that maps strings to strings: the request's secrets. ok is false when
// the message has none.
func secretsField(m protoreflect.Message) (protoreflect.FieldDescriptor, bool) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsMap() && fd.MapKey().Kind() == protoreflect.StringKind && fd.MapValue().Kind() == protoreflect.StringKind && IsSecretField(fd) {
			return fd, true
		}
	}
	return nil, false
}

// merge sets the secrets of req to f's for its class, overlaid with the
// secrets req already carries (a caller's win). A request without a
// secrets field is left alone. It reports whether req has one.
func merge(req proto.Message, f *File) bool {
	m := req.ProtoReflect()
	fd, ok := secretsField(m)
	if !ok {
		return false
	}
	fromFile := f.For(ClassOf(req))
	if len(fromFile) == 0 {
		return true
	}
	mp := m.Mutable(fd).Map()
	for k, v := range fromFile {
		key := protoreflect.ValueOfString(k).MapKey()
		if !mp.Has(key) {
			mp.Set(key, protoreflect.ValueOfString(v))
		}
	}
	return true
}
