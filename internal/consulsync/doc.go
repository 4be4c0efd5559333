// Package consulsync registers the csisupd agent and its CSI plugins in the
// local Consul agent, through the consul/api client.
//
// # What is registered
//
// One service for the agent's gRPC endpoint (Config.ServiceName, ID
// AgentServiceID) with a gRPC health check that Consul runs against the
// agent's health service every GRPCCheckInterval, within GRPCCheckTimeout
// (with TLS and GRPCCheckTLSServerName when the port serves TLS). One
// service per plugin (named Config.PluginServiceName(id), ID
// PluginServiceID(id)) tagged with the plugin type, the vendor version and
// Config.Tags, with meta plugin-id, plugin-type, vendor-name,
// vendor-version, node and external-source = csisupd, and two checks: a TTL
// check (PluginCheckID(id)) that is passing while the plugin is healthy and
// critical otherwise (including before its first probe), with the health
// description as output; and an alias check (AliasCheckID) of the agent's
// service. With ServerService, the server role's service
// (ServerServiceName, ID ServerServiceID) with the same alias check. Plugin
// and server services carry the agent's address and gRPC port: plugins are
// reached through the agent's ClientCSI service.
//
// Every ID starts with ServiceIDPrefix; services and checks with other IDs
// are never changed.
//
// # Sync
//
// A pass works like Consul's own anti-entropy: it reads the agent's
// services once, registers what is missing or differs (allowing for the
// defaults Consul fills in), deregisters csisupd's services that are no
// longer wanted, then reads the checks once and registers or updates the
// checks that differ. A steady-state pass makes two GETs and no writes,
// whatever the number of services.
//
// Checks are compared only by what a Consul agent returns for them (type,
// name, notes, service): Consul never returns a check's definition from
// /v1/agent/checks. Definitions follow from the configuration, and a
// configuration change is a lifecycle change of the service, registered
// again once with all its checks (replace-existing-checks).
//
// Passes run on every registry change (coalesced), every SyncInterval and
// after Reload. A failed pass is retried after Config.Retry's jittered
// exponential backoff (agents whose Consul restarted do not retry in one
// instant); failures are logged when they change and at most every few
// minutes otherwise.
// After a restart, services with csisupd's prefix that this process does
// not know are kept for Probation, so plugins being restored do not flap.
// On shutdown csisupd's services are deregistered if configured, within
// ShutdownTimeout; when Consul cannot be reached the stop still succeeds and
// a warning names every service left behind.
//
// # When the agent dies
//
// A killed agent cannot deregister. Consul's next run of the agent's gRPC
// check fails, and every plugin and server service turns critical with it
// through its alias check: within the check interval plus its timeout, and
// with no write from anyone. The TTL checks keep their last status until
// CheckTTL runs out.
//
// # TTL checks
//
// Plugin health checks are TTL checks with a long TTL (CheckTTL). A pass refreshes a check only when its status or output
// changed or when its last write is older than a quarter to half of the
// TTL (spread by check ID), so steady-state passes do not write.
//
// # Finding the servers
//
// Servers lists the servers registered under ServerServiceName in
// Consul's catalog, for servers and agents that find each other there
// (consul.server_auto_join and consul.client_auto_join). Every caller (the
// server role's join loop, the node client) reads the latest answer of one
// watch per Syncer; none sends a request of its own, so an agent has at
// most one catalog request out whatever asks for the servers and how
// often.
//
// The watch runs with Run, and sends its first request when Servers is
// first called: an agent that finds its servers otherwise never reads the
// catalog. It uses Consul's blocking queries, as consul-template and
// Nomad do: each request carries the X-Consul-Index of the previous
// answer and DiscoveryWait, and Consul answers as soon as the service
// changes, or after the wait (plus a stagger of up to a sixteenth) with
// nothing new. A quiet catalog therefore costs one request per
// DiscoveryWait, and a new or removed server is seen at once. As Consul's
// documentation of blocking queries advises, an index that goes
// backwards or is 0 starts again from 0 (a request that does not block),
// and two requests start at least DiscoveryMinInterval apart, so a
// catalog whose index keeps moving is not read in a tight loop. A failed
// request is retried after Config.Retry's jittered exponential backoff;
// Servers keeps returning the latest list meanwhile (or, before any, the
// error). Reload cancels the request out and starts again with the new
// address, token and names. The watch's loop beats the watchdog loop
// "consul server watch" while idle, while its request is out and while it
// waits; Run waits for it to end, at most ShutdownTimeout.
//
// # Tag override
//
// With EnableTagOverride, tags changed through Consul's catalog (which the
// Consul agent copies into its local service) are adopted by periodic
// passes instead of being restored. A lifecycle change of a service (a new
// plugin instance, a fingerprint with a different identity, a
// configuration change) registers it again with csisupd's tags. The change
// is kept as pending per service until a registration succeeds, so a
// lifecycle change whose first attempt fails is not lost by the retry.
//
// # Configuration
//
// Config has no defaults: the agent fills every value from its validated
// configuration (internal/config), where all defaults live, and New and
// Reload reject a Config with a field missing or out of range. IDs, meta
// keys and check names, csisupd's protocol with Consul, are defined here.
//
// # Authentication
//
// The Consul client is built from consul/api's own configuration, which
// reads the environment as the consul CLI does: the token is Config.Token,
// else the file named by CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN;
// the address is Config.Address, else CONSUL_HTTP_ADDR; CONSUL_HTTP_SSL,
// CONSUL_CACERT and the others apply too. CONSUL_TOKEN, consul-template's
// variable, is not read; a warning says so when it is set and no token
// comes from anywhere else. The token never appears in logs or errors. A 403 is reported as an OpError naming
// the operation and retried with back-off.
//
// # Metrics and liveness
//
// With Config.Metrics, passes, their duration, the writes Consul accepted
// by endpoint (service_register, service_deregister, check_register,
// check_update, check_deregister), failed passes by the reason of their
// first failed request (unreachable, forbidden, rejected, timeout, other)
// and the time of the last successful pass are exported as
// csisupd_consul_sync_*. With Config.Watchdog, Run's loop beats the loop
// "consul sync" on every turn, before every request and while it waits
// out a retry backoff, and the server watch beats "consul server watch".
package consulsync
