// Package heartbeat probes one CSI plugin and keeps its health state machine.
//
// A Monitor sends Probe every interval and also whenever the plugin's gRPC
// connection leaves or re-enters READY, so a dead plugin is noticed within
// milliseconds instead of at the next probe. Health moves between unknown,
// healthy and unhealthy; only moves between states are transitions, and
// steady state reports no transition.
package heartbeat
