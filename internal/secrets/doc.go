// Package secrets gives the CSI calls an agent makes the secrets its
// operator keeps in files on the node, so that no secret ever passes
// through the servers or their raft log.
//
// A plugin's secrets file (the agent config's plugin "<id>" {
// secrets_file = "..." }) is HCL with one block per class of operation,
// each holding string attributes:
//
//	default      { token = "..." }
//	controller   { }   # CreateVolume, DeleteVolume, Controller* calls
//	node_stage   { }   # NodeStageVolume
//	node_publish { }   # NodePublishVolume
//	node_expand  { }   # NodeExpandVolume
//	snapshot     { }   # CreateSnapshot, DeleteSnapshot, ListSnapshots, GetSnapshot
//
// A class's block is merged over default; the secrets a call already
// carries win over both. The file must belong to root or to the agent's
// user and must not be readable or writable by anyone else (0600 or
// stricter): anything else is refused, naming the file, its owner or mode
// and the fix.
//
// A Store holds every plugin's file. Reload (on SIGHUP) reads each again;
// a file that cannot be read or is refused keeps the secrets read last,
// and the error names it. Apply merges a plugin's secrets into a CSI
// request: it is called on the one path every CSI call of the agent
// takes (csiclient.Invoke), so a release or an expansion that the servers
// resume long after the client that started it has gone still carries
// what the plugin needs.
//
// Secret values never leave this package except into the request: errors
// name files, lines, blocks and attribute names, never values.
package secrets
