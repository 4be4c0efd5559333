// Package dockerplugin serves Docker's volume plugin protocol on a unix
// socket, so that Docker and Podman use csisupd's cluster volumes as the
// volumes of a plugin driver: `docker volume create --driver csisupd`,
// `podman run -v NAME:/data`, a Compose file's driver, a quadlet's
// Driver=.
//
// # The protocol
//
// The protocol is JSON over HTTP/1.1, every endpoint a POST, as Docker's
// "Docker volume plugins" and plugin API documents describe it; Podman
// (4.3 and later) speaks the same to the sockets its containers.conf names
// in [engine.volume_plugins]. Server answers with the content type Docker
// plugins use (application/vnd.docker.plugins.v1.1+json) and takes any
// request content type: Docker sends v1.2, Podman v1.1 or JSON.
//
//   - /Plugin.Activate: the plugin implements VolumeDriver.
//   - /VolumeDriver.Create (Name, Opts): creates cluster volume Name
//     through the servers, or adopts the volume of that name when it
//     exists, as Docker expects of a driver whose volumes outlive it. The
//     options are plugin, size, access_mode, access_type, fs_type,
//     mount_flags, topology, snapshot, clone and parameter.<k> (and
//     Podman's own timeout, which it passes on and is ignored); anything
//     else is refused, secret.<k> with the reason (secrets come from the
//     plugin's secrets file on each node).
//   - /VolumeDriver.Remove (Name): deletes the volume; one with claims is
//     refused, naming them.
//   - /VolumeDriver.Mount (Name, ID): claims the volume on this node for
//     workload WorkloadPrefix+ID, owner Owner, with Config.Lease, and
//     answers the claim's host path. The same ID claims again
//     idempotently: an engine that restarts re-sends Mount for the
//     containers it runs and gets the same claim and path.
//   - /VolumeDriver.Unmount (Name, ID): releases that claim.
//   - /VolumeDriver.Path, Get, List: the cluster's volumes, with the host
//     path of this node's claim, and Get's Status carrying the claims.
//   - /VolumeDriver.Capabilities: the scope is global (a volume is the
//     same on every node).
//
// Every error is HTTP 500 with {"Err": "..."}, as Docker's plugin helpers
// answer, saying what to do; unknown paths (404) and other methods (405)
// carry the same body. Errors of the servers are turned into advice by
// their gRPC code: an agent that cannot reach the servers, a token
// without volume:write, a volume still claimed.
//
// Which ID: neither engine sends the container's id. Docker sends an
// opaque 64-hex id it makes for each mount point of a container and keeps
// with the container, so the same container mounts with the same id after
// a daemon restart: one claim per container. Podman (4.3 to 5) counts a
// volume's users itself, calls Mount for the first container and Unmount
// after the last, always with one fixed pseudo id: one claim per volume
// and node. The workload of a claim is WorkloadPrefix and the id either
// way.
//
// # Bounds
//
// The socket is for root and Config.Group only (mode 0660): it is made
// under a temporary name, given its mode and group, and only then renamed
// into place, so it is never reachable with other permissions. Anyone
// who may talk to the socket (or to the Docker daemon) may claim any
// volume on this node. Request bodies are capped (1 MiB), requests run
// at most 2 minutes (Docker's plugin client waits about as long; Podman's
// waits containers.conf's volume_plugin_timeout, 5 seconds by default, so
// a slow mount needs that raised) and at most 64 at a time; headers,
// bodies and idle connections have deadlines.
//
// # Reconcile
//
// With Config.EngineSocket, the engine's Docker-compatible API (docker.sock
// or podman.sock), Run also reconciles the claims of owner Owner on this
// node with the containers the engine has, at start and every
// Config.ReconcileInterval, to release the claims of containers that died
// while the agent was down and whose Unmount never came. A pass reads the
// cluster's claims index first, then the engine's containers (GET
// /containers/json?all=true), then Cluster.Sync with the live workloads
// and that index, so a claim taken after the index was read is never
// released by a list that predates it. A container is live unless it
// exited (or is dead or stopped): one being started has had Mount called
// before it runs. A claim whose id is a listed container's (an engine that
// mounts with container ids) is live exactly while that container is;
// one whose id is no listed container's (Docker's and Podman's ids) is
// live while a live container mounts its volume by name, so a dead
// container's claim on a volume that another live container uses waits
// for that one to stop (or for the engine's Unmount). A pass that cannot list the
// containers releases nothing and is tried again at the next interval.
package dockerplugin
