// Package csiclient holds one gRPC connection to a CSI plugin's unix socket.
//
// The connection dials lazily and redials forever with a backoff capped by the
// caller (the probe interval), so a plugin that starts late or restarts comes
// back without any help from above. Callers watch the connection state to
// notice a dead plugin within milliseconds.
package csiclient
