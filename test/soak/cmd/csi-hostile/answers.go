package main

import (
	"encoding/binary"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// answerMaxFrames sends 16 MiB - 1 byte DATA frames on the call's stream
// until writing fails, ignoring the client's frame size, window and reset.
func (c *conn) answerMaxFrames(cl call) error {
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	for {
		if err := c.writeFrame(http2.FrameData, 0, cl.stream, zeros); err != nil {
			return err
		}
	}
}

// answerHuge sends a valid gRPC message of hugeMessage bytes: one unknown
// length-delimited protobuf field (number 15) of zeros, so it parses as any
// CSI reply.
func (c *conn) answerHuge(cl call) error {
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	const tag = 15<<3 | 2
	// The field's length plus its tag and length varint make the message.
	field := int64(hugeMessage - 2)
	for 1+len(binary.AppendUvarint(nil, uint64(field)))+int(field) > hugeMessage {
		field--
	}
	head := make([]byte, 0, 16)
	head = append(head, 0)
	head = binary.BigEndian.AppendUint32(head, hugeMessage)
	head = append(head, tag)
	head = binary.AppendUvarint(head, uint64(field))
	if err := c.sendData(cl.stream, head, false); err != nil {
		return err
	}
	for left := field; left > 0; {
		chunk := zeros[:min(left, int64(len(zeros)))]
		if err := c.sendData(cl.stream, chunk, false); err != nil {
			return err
		}
		left -= int64(len(chunk))
	}
	return c.writeHeaders(cl.stream, true, grpcTrailers(0, ""))
}

// answerPadded answers a CSI call correctly, its reply split into one-byte
// DATA frames with maximum padding.
func (c *conn) answerPadded(cl call) error {
	msg, ok := paddedReply(c.p.id, cl.path)
	if !ok {
		return c.writeHeaders(cl.stream, true, append(grpcHeaders(), grpcTrailers(12, "csi-hostile: unimplemented "+cl.path)...))
	}
	body, err := proto.Marshal(msg)
	if err != nil {
		return err
	}
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	framed = append(framed, body...)
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	if err := c.sendData(cl.stream, framed, true); err != nil {
		return err
	}
	return c.writeHeaders(cl.stream, true, grpcTrailers(0, ""))
}

// paddedReply is the correct reply of a node plugin to the calls a
// supervisor makes.
func paddedReply(id, path string) (proto.Message, bool) {
	switch path {
	case "/csi.v1.Identity/GetPluginInfo":
		return &csi.GetPluginInfoResponse{Name: id + ".hostile", VendorVersion: "1.0.0"}, true
	case "/csi.v1.Identity/GetPluginCapabilities":
		return &csi.GetPluginCapabilitiesResponse{}, true
	case "/csi.v1.Identity/Probe":
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, true
	case "/csi.v1.Node/NodeGetInfo":
		return &csi.NodeGetInfoResponse{NodeId: "hostile-node"}, true
	case "/csi.v1.Node/NodeGetCapabilities":
		return &csi.NodeGetCapabilitiesResponse{}, true
	case "/csi.v1.Controller/ControllerGetCapabilities":
		return &csi.ControllerGetCapabilitiesResponse{}, true
	}
	return nil, false
}
