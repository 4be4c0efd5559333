package csiclient

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/csisupd/csisupd/internal/secrets"
)

// Redacted replaces secret values in redacted messages and strings.
const Redacted = "[redacted]"

// Redact returns a copy of m in which every field marked secret
// (csi.v1.csi_secret), at any depth, is replaced: map values and strings by
// Redacted, other fields cleared. Map keys are kept so that logs still show
// which secrets were sent. m itself is not changed. A nil m gives nil.
func Redact(m proto.Message) proto.Message {
	if m == nil || !m.ProtoReflect().IsValid() {
		return m
	}
	c := proto.Clone(m)
	redactMessage(c.ProtoReflect())
	return c
}

func redactMessage(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if secrets.IsSecretField(fd) {
			redactField(m, fd, v)
			return true
		}
		forEachSubMessage(fd, v, redactMessage)
		return true
	})
}

func redactField(m protoreflect.Message, fd protoreflect.FieldDescriptor, v protoreflect.Value) {
	switch {
	case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
		mp := v.Map()
		var keys []protoreflect.MapKey
		mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
			keys = append(keys, k)
			return true
		})
		for _, k := range keys {
			mp.Set(k, protoreflect.ValueOfString(Redacted))
		}
	case fd.IsList() || fd.IsMap():
		m.Clear(fd)
	case fd.Kind() == protoreflect.StringKind:
		m.Set(fd, protoreflect.ValueOfString(Redacted))
	case fd.Kind() == protoreflect.BytesKind:
		m.Set(fd, protoreflect.ValueOfBytes([]byte(Redacted)))
	default:
		m.Clear(fd)
	}
}

// forEachSubMessage calls f for every message held by field fd with value v:
// the value of a message field, the elements of a list of messages and the
// values of a map of messages.
func forEachSubMessage(fd protoreflect.FieldDescriptor, v protoreflect.Value, f func(protoreflect.Message)) {
	switch {
	case fd.IsMap():
		if fd.MapValue().Message() == nil {
			return
		}
		v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
			f(mv.Message())
			return true
		})
	case fd.IsList():
		if fd.Message() == nil {
			return
		}
		l := v.List()
		for i := 0; i < l.Len(); i++ {
			f(l.Get(i).Message())
		}
	case fd.Message() != nil:
		f(v.Message())
	}
}

// SecretValues returns the non-empty values of every field marked secret in
// m, at any depth: the values of secret maps and secret strings.
func SecretValues(m proto.Message) []string {
	if m == nil || !m.ProtoReflect().IsValid() {
		return nil
	}
	var out []string
	var walk func(protoreflect.Message)
	walk = func(m protoreflect.Message) {
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if !secrets.IsSecretField(fd) {
				forEachSubMessage(fd, v, walk)
				return true
			}
			switch {
			case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
				v.Map().Range(func(_ protoreflect.MapKey, sv protoreflect.Value) bool {
					if s := sv.String(); s != "" {
						out = append(out, s)
					}
					return true
				})
			case !fd.IsList() && !fd.IsMap() && fd.Kind() == protoreflect.StringKind:
				if s := v.String(); s != "" {
					out = append(out, s)
				}
			}
			return true
		})
	}
	walk(m.ProtoReflect())
	return out
}

// RedactString replaces in s every secret value found in m (see
// SecretValues) by Redacted. Use it on text a plugin produced in answer to m,
// such as an error message, before logging or returning it.
func RedactString(s string, m proto.Message) string {
	for _, v := range SecretValues(m) {
		s = strings.ReplaceAll(s, v, Redacted)
	}
	return s
}

// RedactError returns err with every secret value of req removed from its
// message (see RedactString). A gRPC status keeps its code and details,
// and an error whose message carries no secret is returned as it is. An
// error that is not a gRPC status becomes Unknown with the redacted text:
// a gRPC server would send it as Unknown with its text anyway, so the
// redaction must happen here, and the caller gets the code it would have
// got.
func RedactError(err error, req proto.Message) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return status.Error(codes.Unknown, RedactString(err.Error(), req))
	}
	msg := RedactString(st.Message(), req)
	if msg == st.Message() {
		return err
	}
	p := st.Proto()
	p.Message = msg
	return status.FromProto(p).Err()
}

// redactedJSON formats m for logs with its secrets redacted (see Redact).
func redactedJSON(m proto.Message) string {
	if m == nil || !m.ProtoReflect().IsValid() {
		return "{}"
	}
	return protojson.MarshalOptions{UseProtoNames: true}.Format(Redact(m))
}
