package plugin

// Type is what services a plugin offers: its role. The values are part of
// the external contract (the `type` of `csisupd status --json`).
type Type string

// Plugin types. A plugin is a controller when it advertises the
// CONTROLLER_SERVICE capability, a node when it answers NodeGetInfo, and a
// monolith when both hold; until it is fingerprinted, or when neither
// holds, its type is unknown.
const (
	TypeUnknown    Type = "unknown"
	TypeController Type = "controller"
	TypeNode       Type = "node"
	TypeMonolith   Type = "monolith"
)

// TypeOf returns the type of a plugin that serves the controller service
// (it advertises CapControllerService) when controller is true, and the
// node service (NodeGetInfo answers) when node is true.
func TypeOf(controller, node bool) Type {
	switch {
	case controller && node:
		return TypeMonolith
	case controller:
		return TypeController
	case node:
		return TypeNode
	}
	return TypeUnknown
}

// Roles reports whether a plugin of type t serves the controller and the
// node service; it is TypeOf read backwards. A type that is not one of
// the four, the empty one included, serves neither.
func (t Type) Roles() (controller, node bool) {
	switch t {
	case TypeController:
		return true, false
	case TypeNode:
		return false, true
	case TypeMonolith:
		return true, true
	}
	return false, false
}

// OrUnknown returns t, or TypeUnknown when t is empty.
func (t Type) OrUnknown() Type {
	if t == "" {
		return TypeUnknown
	}
	return t
}

// Capability names, as fingerprints record them and CapabilityMissing
// errors name them: the names of the CSI enums
// (csi.v1.PluginCapability.Service.Type,
// csi.v1.ControllerServiceCapability.RPC.Type and
// csi.v1.NodeServiceCapability.RPC.Type).
const (
	// CapControllerService is the plugin capability of a plugin that
	// serves the controller service.
	CapControllerService = "CONTROLLER_SERVICE"
	// CapNodeService names the node service in CapabilityMissing errors.
	// CSI has no such capability: a plugin serves it when it answers
	// NodeGetInfo (its type is node or monolith).
	CapNodeService = "NODE_SERVICE"

	// Controller capabilities.
	CapPublishUnpublishVolume = "PUBLISH_UNPUBLISH_VOLUME"
	CapCreateDeleteVolume     = "CREATE_DELETE_VOLUME"
	CapListVolumes            = "LIST_VOLUMES"
	CapGetVolume              = "GET_VOLUME"
	CapGetCapacity            = "GET_CAPACITY"
	CapCreateDeleteSnapshot   = "CREATE_DELETE_SNAPSHOT"
	CapListSnapshots          = "LIST_SNAPSHOTS"
	CapCloneVolume            = "CLONE_VOLUME"
	CapModifyVolume           = "MODIFY_VOLUME"
	CapGetSnapshot            = "GET_SNAPSHOT"
	CapListVolumeHealth       = "LIST_VOLUME_HEALTH"

	// CapExpandVolume is a controller and a node capability of the same
	// name.
	CapExpandVolume = "EXPAND_VOLUME"
	// CapGetVolumeHealth is a controller capability (ControllerGetVolumeHealth)
	// and a node capability (NodeGetVolumeHealth) of the same name.
	CapGetVolumeHealth = "GET_VOLUME_HEALTH"
	// CapSingleNodeMultiWriter is a controller and a node capability of the
	// same name: the plugin knows the SINGLE_NODE_SINGLE_WRITER and
	// SINGLE_NODE_MULTI_WRITER access modes.
	CapSingleNodeMultiWriter = "SINGLE_NODE_MULTI_WRITER"

	// Node capabilities.
	CapStageUnstageVolume = "STAGE_UNSTAGE_VOLUME"
	CapGetVolumeStats     = "GET_VOLUME_STATS"
	CapVolumeMountGroup   = "VOLUME_MOUNT_GROUP"
	CapGetStorageHealth   = "GET_STORAGE_HEALTH"
)
