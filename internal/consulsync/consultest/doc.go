// Package consultest runs an HTTP server that behaves like a Consul agent
// for the endpoints csisupd's Consul sync uses, so tests exercise the sync
// through the real consul/api client without a Consul binary.
//
// The Agent reproduces the Consul behaviour the sync relies on:
//
//   - the local agent state: /v1/agent/self, /v1/agent/services,
//     /v1/agent/checks, /v1/agent/service/register (with
//     replace-existing-checks), /v1/agent/service/deregister/:id (404 for
//     unknown ids), /v1/agent/check/register, /v1/agent/check/deregister/:id
//     and /v1/agent/check/update/:id (400 for a bad status, an error for
//     checks without a TTL);
//   - what Consul fills in: default weights, default tagged addresses of a
//     service with an IP address, empty tags and meta instead of null, new
//     checks critical unless a status is given, a re-registered check keeps
//     its status and output, TTL checks expire;
//   - a separate catalog (/v1/catalog/register, /v1/catalog/service/:name,
//     /v1/health/service/:name) that every agent write is pushed to at once,
//     and a full anti-entropy pass the test triggers with AntiEntropy, which
//     copies catalog tags back into local services that enable tag override
//     and otherwise restores the catalog from the local state;
//   - ACLs: tokens from X-Consul-Token, "Authorization: Bearer" or ?token=;
//     403 "ACL not found" for unknown tokens and "Permission denied" for
//     missing rights; reads are filtered silently.
//
// Tests observe it through request counters (Count, Reads, Writes), the
// tokens it received, a change notification (Changed), accessors of the
// local and catalog state, and inject failures with FailNext.
//
// Non-TTL checks (gRPC, HTTP, ...) are stored but never run: their status
// changes only through SetCheckStatus.
package consultest
