package volspec

// ExampleCreate is the specification `csisupd volume init` prints: every
// key of a create, the optional ones commented out, each with what it
// does. It parses as it is (tested), and with every key uncommented but
// clone_id.
const ExampleCreate = `# A csisupd volume specification, for: csisupd volume create -f volume.hcl
# It follows Nomad's volume specification (HCL), so Nomad's volume files work as they are.
# Keys in comments are optional: remove the "# " to use them.

# The volume's id in the cluster, and the name the plugin's CreateVolume gets
# unless name gives it another (as Nomad's name does).
id = "database"
# name = "orders-database"

# Only CSI volumes; type may be left out.
type = "csi"

# The CSI plugin whose controller creates the volume.
plugin_id = "ebs-prod"

# Size: capacity_min is the least the volume gets, capacity_max the most it may
# grow to. Binary (KiB, MiB, GiB, TiB) or decimal (K, M, G, T) units, or bytes.
# capacity_min = "10GiB"
# capacity_max = "20GiB"

# Start from a snapshot or clone a volume the cluster knows (one of the two).
# snapshot_id = "database-nightly"
# clone_id = "database-template"

# How the volume may be used; repeat the block for each way. Access modes:
# single-node-reader-only, single-node-writer, multi-node-reader-only,
# multi-node-single-writer, multi-node-multi-writer. Attachment modes:
# file-system, block-device. Without one: single-node-writer, file-system.
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
# capability {
#   access_mode     = "single-node-reader-only"
#   attachment_mode = "file-system"
# }

# How file-system capabilities are mounted.
# mount_options {
#   fs_type     = "ext4"
#   mount_flags = ["noatime"]
# }

# Where the volume must be accessible from (at least one required segment),
# and where it should be made (preferred, in order).
# topology_request {
#   required {
#     topology { segments = { zone = "us-east-1a" } }
#     topology { segments = { zone = "us-east-1b", rack = "R1" } }
#   }
#   preferred {
#     topology { segments = { zone = "us-east-1a" } }
#   }
# }

# Passed to the plugin's CreateVolume and recorded. Keys that are not plain
# names are quoted: parameters { "csi.storage.k8s.io/fstype" = "ext4" }
# parameters {
#   type = "gp3"
# }

# Passed to CreateVolume and recorded; volume modify changes them later.
# mutable_parameters {
#   iops = "3000"
# }

# Passed to the plugin only: never stored, printed or logged.
# secrets {
#   api_key = "change-me"
# }
`

// ExampleRegister is the specification `csisupd volume init --register`
// prints: every key of a register.
const ExampleRegister = `# A csisupd volume specification, for: csisupd volume register -f volume.hcl
# It follows Nomad's volume specification (HCL), so Nomad's volume files work as they are.
# Keys in comments are optional: remove the "# " to use them.

# The volume's id in the cluster. (Nomad's name may be set too; register does
# not use it: external_id finds the volume.)
id = "database"

# Only CSI volumes; type may be left out.
type = "csi"

# The CSI plugin that serves the volume.
plugin_id = "ebs-prod"

# The volume's id in the storage provider.
external_id = "vol-0123456789abcdef0"

# The volume's size, and the most it may grow to.
# capacity_min = "10GiB"
# capacity_max = "20GiB"

# How the volume may be used; repeat the block for each way (see volume init).
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# How file-system capabilities are mounted.
# mount_options {
#   fs_type     = "ext4"
#   mount_flags = ["noatime"]
# }

# Where the volume is accessible from: a node in any of the segments can use it.
# topology_request {
#   required {
#     topology { segments = { zone = "us-east-1a" } }
#   }
# }

# The volume context the plugin needs to use the volume.
# context {
#   endpoint = "10.0.0.10:3260"
# }

# Recorded with the volume.
# parameters {
#   type = "gp3"
# }
# mutable_parameters {
#   iops = "3000"
# }
`
