// Package config turns HCL config files, environment variables and command
// line flags into one validated agent Config. All defaults live here.
//
// Load applies, in order:
//
//  1. Default values (see Default).
//  2. Config files and directories, in the order given. A directory loads its
//     *.hcl files in lexical order, skipping names that start with a dot.
//     Later files override earlier ones key by key: blocks merge field by
//     field and lists are replaced, not appended.
//  3. The environment: CSISUPD_NAME, CSISUPD_DATA_DIR, CSISUPD_BIND_ADDR,
//     CSISUPD_LOG_LEVEL and CSISUPD_PLUGIN_DIR. Empty variables are ignored.
//  4. Flags the user set on the command line (see RegisterFlags).
//  5. Dev mode adjustments and derived values (plugin_dir from data_dir,
//     advertise_addr from bind_addr).
//  6. Validate, which reports every problem at once.
//
// Errors name where a value came from: "agent.hcl:7: client.probe_interval:
// invalid duration "5x"", "flag --plugin-dir: client.plugin_dir: ..." or
// "env CSISUPD_DATA_DIR: data_dir: ...". Unknown keys and blocks are errors.
//
// DefaultRetry returns the backoff policies of the agent's retry loops.
// They are no part of Config, since no key sets them; the components
// validate the policy they are given and never fill in one of their own.
//
// The server role's settings are one struct, ServerSettings: the server
// block's keys (ServerKeys, part of Config) and the timings and sizes no
// key sets (ServerTuning, from DefaultServerTuning, no part of Config).
// Config.ServerSettings joins them; the server and its raft member take
// that struct as it is, check it with ServerSettings.Validate and fill in
// nothing of their own.
//
// Validate resolves client.plugin_owners (user names or numeric uids) to
// ClientConfig.PluginOwnerUIDs through the system's user database, so an
// unknown name stops the agent before anything starts.
//
// The Consul token is a Secret: it is redacted whenever a Config is printed.
package config
