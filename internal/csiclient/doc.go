// Package csiclient connects to one CSI plugin's unix socket.
//
// A Client holds two connections to the plugin, for two kinds of traffic:
//
//   - the supervision connection (Supervision) carries probes and
//     fingerprints: unary calls, one at a time, over one long-lived HTTP/2
//     connection with one reader goroutine and about 10 KiB of memory. Its
//     end — the plugin died, or said GOAWAY to stop gracefully — is reported
//     through Config.OnDisconnect the moment it happens, so the supervisor
//     notices a dead plugin in milliseconds. It redials at the next call and
//     never gives up.
//   - the full grpc-go connection (Identity, Controller, Node) carries
//     mediated controller calls (ClientCSI), with every status detail,
//     deadline and retry behaviour of grpc-go. It is created at its first
//     call and closes itself after Config.IdleTimeout without calls.
//
// Keeping thousands of grpc-go connections open just to probe would cost
// about 100 KiB and five goroutines each; the split keeps a node with 1,000
// plugins in about 50 MiB.
package csiclient
