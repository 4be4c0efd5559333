// Package registry knows which CSI plugins run on this node.
//
// It has four parts, after kubelet's level-triggered plugin manager:
//
//   - the watcher turns the plugin directory (fsnotify, an initial walk and a
//     periodic rescan as backstop) into the desired set: plugin id -> socket
//     identity. Entries it cannot supervise are listed as ignored with the
//     reason, among them sockets whose path is too long for a unix socket
//     address (over 107 bytes): nobody can connect to those; and entries it
//     does not trust (see Trust below);
//   - the reconciler compares the desired set with the running supervisors,
//     starts, restarts (new socket identity) and stops them, and deregisters a
//     plugin whose socket has been gone for longer than the grace period;
//   - one supervisor per plugin instance dials, fingerprints and probes it and
//     writes what it learns into the store; the probes of all plugins run on
//     one heartbeat.Scheduler, so a plugin costs no goroutine between them;
//   - the store (Registry) holds the records, the event log and the
//     subscriptions, and is persisted in the data directory.
//
// # Sources
//
// Three sources claim plugin ids: a declared socket
// (ManagerConfig.Declarations, the plugin blocks of the configuration,
// which may name a socket anywhere), the endpoint of a kubelet
// registration (the registration sockets of
// ManagerConfig.KubeletRegistrationDir, asked as kubelet asks them; see
// registrations), and a socket in the plugin directory. Every scan of the
// watcher looks at all three, and mergeClaims decides:
//
//   - no live takeover: an id whose plugin is in use (healthy, or with
//     volumes on this node, ManagerConfig.InUse) keeps the socket of its
//     record, whatever claim appears later, and while that socket is gone
//     (its deregistration pending) nobody gets the id. Only a plugin
//     deregistered, or neither healthy nor in use, or whose socket no
//     source names any more while it is still there (a declaration moved:
//     the operator's decision), lets its id go;
//   - otherwise the order of the sources decides between the claims that
//     meet (at start, or once the holder is gone): declared first, then
//     kubelet, then the plugin directory, and between two of one kind the
//     smaller path; the choice is the same after a restart;
//   - one socket serves one id: a declaration or registration naming a
//     socket that serves another id is refused (a discovered socket named
//     so is simply not a plugin of its own).
//
// A claim that loses to another at a different path, or to another id at
// the same socket, is a conflict: one plugin-conflict event, under the
// refused id, says which socket holds what and why, a log line names both
// sockets, and the refused entry is listed as ignored. A losing kubelet
// registration is refused for good, as kubelet refuses one: its registrar
// is told why (NotifyRegistrationStatus(false, reason)) and exits, and its
// restart, a new socket, is a new registration. One socket named by two
// sources under one id is one plugin. The directories of declared sockets
// and endpoints are watched too, and while a claim is refused every
// change of the registry is scanned, so a holder that lets go is replaced
// at once.
//
// A registration is refused as well when its endpoint lies outside
// ManagerConfig.KubeletEndpointDirs, or fails the trust rules of a plugin
// socket (below). Registration sockets are asked at most
// MaxRegistrationCalls at a time; one that does not answer, or answers
// garbage, is asked again after waits that grow (ManagerConfig.KubeletRetry)
// up to a minute, each attempt one connection.
//
// A declaration may also expect a type (a plugin fingerprinted as another
// is unhealthy) and make the plugin required: a required plugin without a
// healthy instance for its HealthTimeout emits plugin-missing once per
// episode, and while it has no record the read model (Source) lists it
// with health state HealthMissing and why, so the servers count it as
// expected but not healthy. Manager.SetDeclarations (a reload) touches
// only the plugins whose declaration changed.
//
// # Trust
//
// Whatever answers on a plugin socket receives the volume secrets of its
// plugin's calls, so the watcher dials only sockets nobody untrusted can
// have put there:
//
//   - the plugin directory must be writable by neither its group nor others
//     and owned by root or the agent's user (checked at every scan; the
//     agent also refuses to start without it, see CheckPluginDir, which
//     checks the parents too: none may be writable by others unless it is
//     sticky). While it fails, no socket in it is dialled;
//   - a plugin subdirectory <id>/ must pass the same checks, with the plugin
//     owners (client.plugin_owners) allowed as owners too; one that fails is
//     ignored;
//   - a socket must be owned by root, the agent's user or a plugin owner;
//   - symlinks are never followed, as <id>.sock, as <id>/ or as
//     <id>/csi.sock, whether they point inside the plugin directory or out
//     of it: the socket layout has no need for them.
//
// The directory checks can be turned off (client.allow_insecure_plugin_dir);
// the owner and symlink rules cannot. Each refused entry is listed as ignored
// and reported by one plugin-socket-ignored event, emitted again only when
// the reason changes (say, the owner) or the entry was fixed and broke again.
// Owners are read from lstat(2) (Linux stat data). The parents' owners and
// group write bits are not checked.
//
// # Bounded lifecycle
//
// No plugin can stall the registry, whatever it does (stop reading, stop
// altogether, answer with garbage):
//
//   - every call to a plugin is bounded: a probe or fingerprint by the probe
//     timeout, each write by the same timeout, each reply by the message
//     size limit (ManagerConfig.MaxPluginMessageSize);
//   - the reconciler never waits for a plugin. A supervisor to stop (its
//     socket was removed past the grace period, or replaced) leaves the live
//     set at once and is stopped in the background: its connection is closed
//     first, so calls blocked on the plugin fail, then it is cancelled and
//     waited for, for at most ManagerConfig.StopTimeout. One that still runs
//     then is abandoned: logged at warn with the plugin and its socket, and
//     counted (Manager.AbandonedSupervisors). A replaced socket's new
//     supervisor starts at once; the old one is fenced first, so it can
//     never write over the new instance's record;
//   - shutdown closes every connection and cancels every supervisor at once,
//     waits for all of them for at most StopTimeout in total, abandons the
//     rest, and saves the registry;
//   - a plugin that violates the gRPC protocol (an oversized reply, a
//     malformed answer) is backed off: consecutive violations space its
//     probes, or fingerprints, exponentially from the probe interval up to
//     two minutes, with jitter, and its health description says why and
//     when the next attempt is. Any other result ends the series.
//
// # Metrics and liveness
//
// The registry counts what happens to its plugins as Prometheus series
// (metrics.go), registered by the Manager with ManagerConfig.Metrics:
// probe durations and failures by reason (timeout, unreachable,
// not_ready, protocol, error, told apart by the Probe call's error that
// heartbeat.Result carries), the time of the latest healthy probe, health
// transitions, fingerprint durations and changes, full scans of the plugin
// directory, and the change notifications coalesced for slow subscribers.
// What the registry holds anyway (plugin health, events, size, abandoned
// supervisors) is read at scrape time. Series labelled by plugin_id exist
// only for registered plugins: they are created at registration, deleted
// at deregistration, and written under the registry's lock only while the
// writing instance is the registered one, so a late probe of a
// deregistered plugin brings none back. They are kept only once the
// metrics are registered: with metrics off nothing could read them.
//
// The watcher, the reconciler and the persister are the manager's
// essential loops: each beats a watchdog Loop (ManagerConfig.Watchdog) on
// every turn, so a loop that wedges stops the systemd watchdog's pings
// and the agent is restarted. Supervisors are not loops: a plugin that
// hangs is bounded by its deadlines and never restarts the agent.
package registry
