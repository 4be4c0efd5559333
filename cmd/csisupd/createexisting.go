package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// existingVolume returns the volume req would create when it exists
// already, and nil when it does not or when the lookup fails: the create
// then runs and reports as it does.
func existingVolume(ctx context.Context, cl csisupdv1.ControlClient, req *csisupdv1.VolumeCreateRequest) *csisupdv1.Volume {
	resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: req.GetId()})
	if err != nil {
		return nil
	}
	return resp.GetVolume()
}

// specDifference names the first key of req that the existing volume v
// does not have as asked, with both values, or returns "" when v is what
// req would create. Keys req leaves unset are not compared: the servers
// or the plugin chose them.
func specDifference(v *csisupdv1.Volume, req *csisupdv1.VolumeCreateRequest) string {
	switch {
	case v.GetPluginId() != req.GetPluginId():
		return fmt.Sprintf("plugin: the volume is of plugin %s, the spec asks %s", v.GetPluginId(), req.GetPluginId())
	case req.GetCapacityMinBytes() > 0 && v.GetCapacityBytes() < req.GetCapacityMinBytes():
		return fmt.Sprintf("capacity: the volume has %s, the spec asks at least %s",
			formatBytes(v.GetCapacityBytes()), formatBytes(req.GetCapacityMinBytes()))
	case req.GetCapacityMaxBytes() > 0 && v.GetCapacityLimitBytes() != req.GetCapacityMaxBytes():
		return fmt.Sprintf("capacity-max: the volume may grow to %s, the spec asks %s",
			formatBytes(v.GetCapacityLimitBytes()), formatBytes(req.GetCapacityMaxBytes()))
	case len(req.GetCapabilities()) > 0 && !sameCapabilities(v.GetCapabilities(), req.GetCapabilities()):
		return fmt.Sprintf("capability: the volume has %s, the spec asks %s",
			formatCapabilities(v.GetCapabilities()), formatCapabilities(req.GetCapabilities()))
	case !maps.Equal(v.GetParameters(), req.GetParameters()):
		return fmt.Sprintf("parameter: the volume has %s, the spec asks %s", formatMap(v.GetParameters()), formatMap(req.GetParameters()))
	case !maps.Equal(v.GetMutableParameters(), req.GetMutableParameters()):
		return fmt.Sprintf("mutable-parameter: the volume has %s, the spec asks %s",
			formatMap(v.GetMutableParameters()), formatMap(req.GetMutableParameters()))
	case formatSource(v.GetContentSource()) != formatSource(req.GetContentSource()):
		return fmt.Sprintf("content source: the volume was created from %s, the spec asks %s",
			formatSource(v.GetContentSource()), formatSource(req.GetContentSource()))
	}
	return ""
}

// sameCapabilities reports whether have and want hold the same
// capabilities, in any order.
func sameCapabilities(have, want []*csisupdv1.VolumeCapability) bool {
	if len(have) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h *csisupdv1.VolumeCapability) bool { return proto.Equal(h, w) }) {
			return false
		}
	}
	return true
}

// formatCapabilities prints capabilities as the flags spell them.
func formatCapabilities(caps []*csisupdv1.VolumeCapability) string {
	parts := make([]string, len(caps))
	for i, c := range caps {
		parts[i] = c.GetAccessType() + " " + accessModeName(c.GetAccessMode())
		if c.GetFsType() != "" {
			parts[i] += " " + c.GetFsType()
		}
	}
	return formatList(parts)
}

// reportExisting tells of a create whose volume exists: with the same
// spec it says so and succeeds (with --json, the volume as a create
// prints it); with another it fails naming the first key that differs.
func reportExisting(w io.Writer, asJSON bool, v *csisupdv1.Volume, req *csisupdv1.VolumeCreateRequest) error {
	if d := specDifference(v, req); d != "" {
		return fmt.Errorf("volume %s already exists with another spec: %s", v.GetId(), d)
	}
	if asJSON {
		return printProto(w, v)
	}
	_, err := fmt.Fprintf(w, "Volume %s already exists (plugin %s, external id %s): nothing to create\n",
		display(v.GetId()), display(v.GetPluginId()), display(v.GetExternalId()))
	return err
}
