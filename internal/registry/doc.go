// Package registry knows which CSI plugins run on this node.
//
// It has four parts, after kubelet's level-triggered plugin manager:
//
//   - the watcher turns the plugin directory (fsnotify, an initial walk and a
//     periodic rescan as backstop) into the desired set: plugin id -> socket
//     identity. Entries it cannot supervise are listed as ignored with the
//     reason, among them sockets whose path is too long for a unix socket
//     address (over 107 bytes): nobody can connect to those;
//   - the reconciler compares the desired set with the running supervisors,
//     starts, restarts (new socket identity) and stops them, and deregisters a
//     plugin whose socket has been gone for longer than the grace period;
//   - one supervisor per plugin instance dials, fingerprints and probes it and
//     writes what it learns into the store;
//   - the store (Registry) holds the records, the event log and the
//     subscriptions, and is persisted in the data directory.
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
package registry
