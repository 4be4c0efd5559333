// Package rpc holds csisupd's gRPC services and their shared plumbing.
//
// ClientCSI lets a control plane call the controller service of a CSI plugin
// on this node. Its calls go through the node's one plugin call path
// (csiclient.Invoke, shared with the node volume manager): it looks the
// plugin up in the live registry, refuses calls the plugin cannot serve
// with typed errors (see the api package: PluginNotFound,
// PluginUnhealthy, CapabilityMissing, Retryable, Ignorable), applies a
// default deadline, retries transient failures and redacts the request's
// secrets from errors and logs. ClientCSI adds per-method deadlines,
// serialises destructive calls per plugin, marks a NotFound of an
// idempotent removal Ignorable, and otherwise passes the plugin's
// responses and errors through unchanged.
//
// The Agent service reports the node's plugins (a plugin.Source) and
// streams their events: each stream is a subscription to the node's event
// log (package stream) and holds one event at a time; streams beyond
// client.max_event_subscribers (in all) or
// client.max_event_subscribers_per_connection (on one transport
// connection, recognised by TagConns) are refused with
// ResourceExhausted; a stream that falls too far behind ends with
// ResourceExhausted and the index to resume from (EventsFellBehind), from
// which a new stream (from_index) continues without a gap. The service
// exports its open streams (csisupd_event_subscribers) and those ended
// for falling behind (csisupd_event_subscribers_dropped_total).
//
// The Agent service's debugging methods (agent_debug.go) serve `csisupd
// monitor` and `csisupd operator debug`: Monitor streams the agent's log
// lines at a level of the caller's through a sink of the agent's
// hclog.InterceptLogger (bounded, dropping rather than blocking the
// logger; at most MaxMonitors at a time), Profile runtime/pprof profiles
// (with ACLs off only when enable_debug is set), Metrics the agent's
// Prometheus registry in the text format, and Config the effective
// configuration with secrets redacted.
//
// Authorizer decides every call in one interceptor: the caller's role
// from its certificate and the capability its ACL token grants, by the
// rules of package acl (TokenCache looks tokens up for agents without the
// server role).
//
// The package takes what it needs of the agent's configuration as
// arguments (TLS, limits, log levels, latency buckets, retry policies); it
// does not read the configuration itself.
package rpc
