// Package heartbeat probes one CSI plugin and keeps its health state machine.
//
// A Monitor sends Probe every interval and also whenever its owner calls
// ProbeNow — the supervisor does so the moment the plugin's connection
// breaks — so a dead plugin is noticed within milliseconds instead of at the
// next probe. Health moves between unknown,
// healthy and unhealthy; only moves between states are transitions, and
// steady state reports no transition.
package heartbeat
