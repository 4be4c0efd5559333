// Package csiclient connects to one CSI plugin's unix socket, and holds
// the node's one path for calling plugins (Invoker, see "The call path").
//
// Which connection: the agent on the plugin's node is the gRPC client
// here, and the CSI plugin, listening on its unix socket, is the server.
// Not to be confused with package nodeclient (the agent dialling the
// servers' Cluster service) or with the agent's client.go (the setup of
// the client role).
//
// A Client holds two connections to the plugin, for two kinds of traffic:
//
//   - the supervision connection (Supervision) carries probes and
//     fingerprints: unary calls over one long-lived HTTP/2 connection. Its
//     end — the plugin died, or said GOAWAY to stop gracefully — is reported
//     through Config.OnDisconnect the moment it happens, so the supervisor
//     notices a dead plugin in milliseconds. It redials at the next call and
//     never gives up; calls that wait for it to be ready redial with the
//     jittered backoff of Config.Redial.
//   - the full grpc-go connection (Identity, Controller, Node) carries
//     mediated controller calls (ClientCSI), with every status detail,
//     deadline and retry behaviour of grpc-go. It is created at its first
//     call and closes itself after Config.IdleTimeout without calls.
//
// # The supervision connection
//
// It is built from maintained libraries, with no protocol code of its own:
//
//   - HTTP/2 is golang.org/x/net/http2: one ClientConn per plugin, made with
//     Transport.NewClientConn on a unix socket we dial ourselves and wrap in
//     a watchedConn. The watchedConn reports the plugin's end once per
//     connection: at the first failed read, or when the connection is
//     closed without our asking (x/net closes it when the plugin's GOAWAY
//     has no stream left to finish; an idle connection told to go away is
//     closed at once through the transport's pool hook, see goAwayWatcher).
//     x/net does the framing, HPACK, flow control (padding included), GOAWAY
//     and RST_STREAM handling.
//   - gRPC is connectrpc.com/connect's gRPC protocol client (WithGRPC) over
//     a connect.HTTPClient that hands each request to its call's
//     ClientConn. A pass-through codec carries marshalled messages, since
//     Invoke gets messages of any type; the connect clients (one per method)
//     and the x/net transports (one per configuration) are shared by all
//     plugins, so a plugin costs only its connection.
//
// Measured with BenchmarkIdleConnections (1,000 idle connections to one
// plugin in another process), a supervision connection costs one goroutine
// (x/net's reader), about 17 KiB of heap and 4 KiB of goroutine stack; the
// full grpc-go connection, with the small buffers New gives it, costs five
// goroutines and about 37 KiB. Supervising 1,000 plugins thus takes about
// 17 MiB and 1,000 goroutines instead of 37 MiB and 5,000; the full
// connection is opened only for plugins that ClientCSI calls.
//
// A minimal gRPC layer — a 5-byte length prefix, grpc-status, grpc-message
// and grpc-status-details-bin, grpc-timeout — would be about 150 lines and
// enough for unary calls; it is what this package had. connect was kept
// instead: it is maintained and conformance-tested against grpc-go,
// handles the corner cases such a layer gets wrong (percent-encoding,
// trailers-only answers, details, cardinality, malformed envelopes), and
// costs nothing per plugin since its clients are shared. Where its choices
// differ from what supervision needs, this package sets them: compression
// is refused rather than negotiated, the reply body is capped before
// connect reads it (connect would otherwise read and discard a whole
// oversized message), and errors are classified from what the transport
// saw, as grpc-go would report them.
//
// The cost was compared, too: with a bare length-prefix round trip in
// place of connect (an experiment, without the checks above), 1,000
// plugins cost the same CPU within the noise of the steady-state benchmark
// and 4-9 MiB less RSS, and a probe 61 instead of 99 allocations
// (BenchmarkProbe). Almost all of a probe's CPU is x/net, the Go runtime and
// the kernel; connect is about 2 % of it.
//
// # Bounds and caps
//
//   - Every write to the plugin, and the dial, is bounded by
//     Config.WriteTimeout (DefaultWriteTimeout, 5 s): a plugin that stops
//     reading makes the write fail, and the connection closes and is
//     reported. Calls wait for the plugin only as long as their context
//     allows; callers pass deadlines, which the plugin receives as
//     grpc-timeout.
//   - A call that times out or is cancelled resets its stream (RST_STREAM
//     CANCEL), and ends with DeadlineExceeded or Canceled, not Unavailable.
//   - Close closes the connection first and never waits on the plugin.
//   - A reply is capped at Config.MaxMessageSize (DefaultMaxMessageSize,
//     4 MiB, grpc-go's default): a larger one is refused with
//     ResourceExhausted after at most that much has been read, and its
//     stream is reset. The plugin may send frames of 16 KiB (the HTTP/2
//     minimum) and have at most one receive window in flight, per stream
//     and per connection: the cap plus 5 bytes, between 64 KiB and 256 KiB.
//     Reply headers and trailers, and the metadata a call sends, are capped
//     at 64 KiB; the HPACK table the plugin may make us keep at 4 KiB.
//
// # The call path
//
// ClientCSI (package rpc) and the node volume manager (package nodevolumes) call
// plugins through one Invoker each, both the same code: Invoke finds the
// plugin through a PluginLookup (the registry's Manager) and checks that it
// is healthy, fingerprinted and has the service and capability the call
// needs (Resolve, with the typed errors of the api package); gives a call
// without a deadline the caller's default; retries Unavailable,
// ResourceExhausted and DeadlineExceeded (RetryableCode) up to MaxAttempts
// attempts, each after the retry policy's jittered backoff and only while the
// deadline leaves room, finding the plugin again before each; and removes
// every value of a field CSI marks secret (csi_secret) from the errors it
// returns and the lines it logs (RedactError, RedactString, Redact). An
// error that is not a gRPC status comes back as Unknown, redacted, as a gRPC
// server would send it.
//
// # Errors
//
// Calls return gRPC status errors with the codes, messages and details
// grpc-go would give, including its mapping of RST_STREAM codes. Those for
// which IsProtocolViolation is true mean the plugin broke the protocol
// (too large, malformed or not gRPC at all, or broke HTTP/2) rather than
// being slow or gone; their message starts with "protocol violation:" and
// says what was violated.
//
// x/net v0.60.0 marks its client Transport and ClientConn deprecated in
// favour of net/http's Transport.NewClientConn (Go 1.26), whose errors are
// unexported types; the exported x/net error types are what lets this
// package classify errors without matching strings. From Go 1.27 x/net
// wraps net/http, whose pool is told of a connection's end but not of a
// GOAWAY: an idle connection told to go away would then be reported at the
// next call (TestGoAwayWhileIdle checks the current behaviour).
package csiclient
