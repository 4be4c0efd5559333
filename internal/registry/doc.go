// Package registry knows which CSI plugins run on this node.
//
// It has four parts, after kubelet's level-triggered plugin manager:
//
//   - the watcher turns the plugin directory (fsnotify, an initial walk and a
//     periodic rescan as backstop) into the desired set: plugin id -> socket
//     identity;
//   - the reconciler compares the desired set with the running supervisors,
//     starts, restarts (new socket identity) and stops them, and deregisters a
//     plugin whose socket has been gone for longer than the grace period;
//   - one supervisor per plugin instance dials, fingerprints and probes it and
//     writes what it learns into the store;
//   - the store (Registry) holds the records, the event log and the
//     subscriptions, and is persisted in the data directory.
package registry
