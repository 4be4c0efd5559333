// Package volspec reads volume specification files: HCL that follows
// Nomad's volume specification, so that a Nomad operator's volume files
// work with `csisupd volume create -f` and `volume register -f` as they
// are.
//
// Parse decodes a file into a Spec, checking every key and value where it
// is written: unknown keys and blocks, values of the wrong type, sizes
// that do not parse and access modes csisupd does not know are errors
// naming the file and line ("volume.hcl:7: capacity_min: ..."), every
// problem of the file at once. A Spec is plain data the CLI may change
// (its flags override a file's keys) before turning it into the request
// of Control.CreateVolume (CreateRequest) or the volume of
// Control.RegisterVolume (Volume); those check what depends on the
// operation, such as the keys only one of them takes.
//
// Nomad's keys, and where csisupd differs from Nomad:
//
//   - A file's name, when it differs from its id, is what Nomad makes of
//     it: the name the plugin's CreateVolume gets (CreateRequest's name),
//     while jobs and commands know the volume by its id. A file without
//     id is known by its name. On register the name is not used: the
//     volume exists, and external_id finds it.
//   - csisupd has no namespaces: namespace may only be "default".
//   - type must be "csi" (the default); Nomad's host volumes are not
//     csisupd's business.
//   - mutable_parameters (ControllerModifyVolume's parameters) is
//     csisupd's own key.
//
// Nomad reads volume files as HCL 1; Parse reads a file as HCL 2, and as
// HCL 1 when all HCL 2 refuses is lines in HCL 1's forms, so both
// syntaxes work: Nomad's
// one-line blocks holding several arguments, separated by commas or not
// (topology { segments { rack = "R1", zone = "z1" } }), and quoted keys
// ("csi.storage.k8s.io/fstype" = "ext4") as well as HCL 2's arguments
// with objects (segments = { rack = "R1" }).
//
// Nomad also takes volume files in JSON, as HCL 1 does: a file that starts
// with "{" (after white space) or whose name ends in ".json" is read as
// JSON, the same keys in one object, a block as an object and a
// repeatable block as a list of objects, and decoded as an HCL file is,
// with the same checks and file:line errors.
//
// Secrets are never printed: Spec's Secrets redacts its values when
// formatted, and no error quotes a secret's value.
package volspec
