// Package consultest runs HTTP servers that behave like Consul agents for
// the endpoints csisupd's Consul sync uses, so tests exercise the sync
// through the real consul/api client without a Consul binary.
//
// # Version
//
// The double follows Consul 1.21.x (Community Edition, no namespaces or
// partitions), the generation github.com/hashicorp/consul/api v1.34
// belongs to: the field sets, defaults, status codes and error messages
// below are those of its agent/agent_endpoint.go, agent/checks and state
// store. Where the double departs from it, this comment says so.
//
// # What is reproduced
//
// Agent endpoints, answered from the agent's local state:
//
//   - GET /v1/agent/self (Config.NodeName, Config.Datacenter, Member...).
//   - GET /v1/agent/services: a map of service ID to the AgentService
//     field set (ID, Service, Tags, Meta, Port, Address, TaggedAddresses
//     only when not empty, Weights, EnableTagOverride, Datacenter), with
//     [] and {} instead of null tags and meta, default weights {1, 1} and
//     default lan/wan tagged addresses for an IP address. The agent serves
//     no CreateIndex or ModifyIndex there.
//   - GET /v1/agent/checks: a map of check ID to structs.HealthCheck with
//     exactly Node, CheckID, Name, Status, Notes, Output, ServiceID,
//     ServiceName, ServiceTags ([] rather than null), Type, Interval and
//     Timeout (duration strings, "" when unset, so "" for TTL and alias
//     checks), ExposedPort (0), Definition and CreateIndex/ModifyIndex (0:
//     the local state has no Raft indexes). Definition is always the empty
//     object {}: a Consul agent never fills it in for checks it runs, and
//     there is no endpoint that reads back a check's interval, timeout,
//     TTL or target (hashicorp/consul#8309, #18096, #20409). Agent.Check and
//     Agent.Checks return the same view; Agent.CheckDefinition is the
//     test-only view of what was registered.
//   - PUT /v1/agent/service/register (with replace-existing-checks),
//     /v1/agent/service/deregister/:id (404 for unknown IDs; the service's
//     checks go with it), /v1/agent/check/register (404 for an unknown
//     ServiceID), /v1/agent/check/deregister/:id (404 for unknown IDs) and
//     /v1/agent/check/update/:id (400 for a bad status, 500 for a check
//     without a TTL, output capped at 4 KiB with Consul's note).
//   - Check registration as Consul validates it (CheckType.Validate, 400
//     "Invalid check: ..."): an interval check (gRPC, HTTP, TCP, UDP,
//     H2PING, script) needs an Interval, a TTL check a TTL, never both; an
//     alias check needs neither and takes no TTL or probe target; script and
//     Docker checks are refused (500) as on an agent without
//     enable_script_checks. Default check IDs ("service:<id>", with ":<n>"
//     when a registration has several checks) and names ("Service '<name>'
//     check"), the type Consul derives (grpc, http, ttl, tcp, udp, alias,
//     h2ping), and the initial status critical unless Status is given. A
//     re-registered check keeps its status and output (its runner and TTL
//     restart); a deregistered service removes its checks.
//
// Checks run as a Consul agent runs them:
//
//   - TTL checks expire to critical with "TTL expired", or "TTL expired
//     (last output before timeout follows): <output>" after an update that
//     set an output; an update revives an expired check. Expiry follows
//     Config.Now: it is applied at every request and accessor call, and a
//     timer on the real clock applies and pushes it without a request.
//   - gRPC checks: a goroutine per check waits a random stagger in [0,
//     Interval), then every Interval dials the target (host:port, or
//     host:port/service to ask for that service) with the check's Timeout
//     (10s when unset) and calls grpc.health.v1.Health/Check. SERVING is
//     passing with "gRPC check <target>: success"; another status is
//     critical with "gRPC <target> serving status: <status>"; an error is
//     critical with "gRPC check <target>: <error>" (Consul reports the bare
//     error, which does not always name the target). With GRPCUseTLS the
//     dial uses a clone of Config.CheckTLS (system roots when nil) with
//     ServerName from TLSServerName and InsecureSkipVerify from
//     TLSSkipVerify, as with enable_agent_tls_for_checks; otherwise
//     insecure credentials. SuccessBeforePassing, FailuresBeforeWarning
//     and FailuresBeforeCritical apply as in Consul's StatusHandler.
//     Re-registering or deregistering the check, or Close, stops its
//     runner; Close waits for all of them. Config.ManualChecks turns the
//     runners off for tests that set statuses with SetCheckStatus (a real
//     agent always runs them).
//   - Alias checks: with AliasService and no AliasNode, the status is
//     computed from this agent's checks of that service and its node checks
//     (ServiceID ""): critical if any is critical, else warning if any is
//     warning (output `Aliased check "<name>" failing: <output>`), else
//     passing ("All checks passing.", or "No checks found." without
//     checks); critical with "Service <id> could not be found on node
//     <node>" when the service is not registered (Consul 1.21 leaves <node>
//     empty for a local alias; the double names the agent's node). With
//     AliasNode, the same is computed from that node's checks in the
//     catalog (serfHealth included). Alias checks are not inputs of alias
//     checks (Consul counts a node-level alias check among the node checks
//     it aggregates, a feedback loop the double leaves out). They are
//     re-evaluated synchronously after every change: registrations,
//     deregistrations, TTL updates and expiry, gRPC results,
//     SetCheckStatus.
//
// The catalog, as the servers hold it:
//
//   - Every local change (write, check result, expiry, alias) is pushed
//     to the catalog at once, as the agent's sync after each change does,
//     and wakes Changed. The catalog keeps CreateIndex and ModifyIndex,
//     copies a service's name and tags into its checks, and keeps the
//     index of an entry that did not change.
//   - Each agent registers its node: a stable UUID ID, its address, lan,
//     lan_ipv4, wan and wan_ipv4 tagged addresses, consul-network-segment
//     and consul-version meta, and the servers' serfHealth check ("Serf
//     Health Status", passing, "Agent alive and reachable"). Close turns
//     serfHealth critical ("Agent not live or unreachable"); the node's
//     services stay, as a failed node's do until it is reaped.
//   - PUT /v1/catalog/register (a check registered there keeps the
//     Definition it was given, as the servers keep it), GET
//     /v1/catalog/service/:name (structs.ServiceNode: node ID, address,
//     tagged addresses and meta, Service* fields, an empty ServiceProxy and
//     ServiceConnect) and GET /v1/health/service/:name (structs.
//     CheckServiceNode: Node, Service with an empty Proxy and Connect, and
//     the node's and the service's checks with an empty Definition),
//     ordered by node name, then service ID, filtered by ?tag=, and by
//     ?passing (which drops an instance with any check not passing; 400
//     for an invalid value).
//   - Blocking queries of GET /v1/catalog/service/:name and GET
//     /v1/health/service/:name, as Consul 1.21 serves them: every answer
//     carries X-Consul-Index, the service's index (the index of the last
//     change to one of its instances, their nodes or their checks; for a
//     service without instances, the index at which a service last lost
//     its last instance, else the index of the last change to any node
//     or service, and for health queries any check: so a query of a
//     service that never existed wakes at every such change, as in
//     Consul, hashicorp/consul#3890), never below 1. With
//     ?index=N (N > 0) the request blocks until that index moves past N,
//     the wait passes, the client goes away or the agent closes, then
//     answers the current state (a timeout answers the same index: no
//     change). ?wait= is a Go duration ("2s", "5m"; consul/api sends
//     milliseconds), 5m when absent or not positive, cut to 10m, plus
//     Consul's random stagger of up to wait/16 (QueryWait); an invalid
//     ?wait= or ?index= is a 400 ("Invalid wait time", "Invalid index").
//     Without ?index= (or with 0) a read answers at once. An index that
//     went backwards (a new Catalog behind the same address) blocks the
//     whole wait and answers the smaller index, as after a Consul restore.
//   - AntiEntropy runs a full anti-entropy pass on demand: node info is
//     restored, tag override adopts catalog tags, then the node's services
//     and checks in the catalog are replaced by the local ones (serfHealth
//     stays).
//   - Several agents: agents created with the same Catalog (NewCatalog,
//     Config.Catalog) are the agents of the nodes of one datacenter, each
//     with its own node name, address and HTTP listener. Catalog and
//     health queries on any of them list the instances of every node. The
//     Catalog owns the one lock and index of all its agents.
//
// ACLs: tokens from X-Consul-Token, "Authorization: Bearer" or ?token=;
// 403 "ACL not found" for unknown tokens and "Permission denied" for
// missing rights; reads are filtered silently (with
// X-Consul-Results-Filtered-By-ACLs). The ACL system is per agent.
//
// Tests observe the double through request counters (Count, Reads,
// Writes), the tokens it received, a change notification (Changed),
// accessors of the local and catalog state (Service, Services, Check,
// Checks, CheckDefinition, CatalogService), and inject failures with
// FailNext.
//
// # What is not reproduced
//
//   - Blocking queries of other endpoints (their ?index= and ?wait= are
//     ignored: they answer at once), hash-based blocking (?hash=),
//     consistency modes, agent caching and streaming.
//   - The ?filter= expression language (400 when given); ?near=, ?ns=,
//     ?partition=, ?peer= and ?dc= are ignored.
//   - Endpoints other than the ones above (404); in particular
//     /v1/agent/service/:id, maintenance mode, /v1/agent/check/pass|warn|
//     fail, /v1/catalog/deregister, /v1/catalog/nodes and /v1/health/
//     node|checks|state.
//   - HTTP, TCP, UDP, H2PING, script, Docker and OS service checks are
//     stored but never run: their status changes only through
//     SetCheckStatus.
//   - Consul raises check intervals below 1s to 1s; the double runs them
//     as registered so tests can use short intervals.
//   - check_update_interval: Consul defers pushing an output-only change
//     to the catalog by up to 5 minutes; the double pushes it at once.
//   - DeregisterCriticalServiceAfter (reaping), OutputMaxSize other than
//     the 4 KiB default, Connect, sidecars, proxies, gateways, service
//     kinds other than typical, sockets, locality.
//   - Persistence: the local state is lost at Close, and a new agent for a
//     node starts empty (its old catalog entries remain until AntiEntropy).
//   - Gossip: node failure is only what Close does to serfHealth; nodes are
//     never reaped.
//   - The order of instances Consul returns after ?passing filtering (it
//     swaps entries); the double keeps node, then service ID order.
//   - The output of an alias check whose several aliased checks fail names
//     the first in check ID order (Consul's depends on map order).
package consultest
