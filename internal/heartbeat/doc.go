// Package heartbeat probes one CSI plugin and keeps its health state machine.
//
// A Monitor sends Probe every interval and also whenever its owner calls
// ProbeNow — the supervisor does so the moment the plugin's connection
// breaks — so a dead plugin is noticed within milliseconds instead of at the
// next probe. Health moves between unknown,
// healthy and unhealthy; only moves between states are transitions, and
// steady state reports no transition.
//
// The Monitor is the one owner of probe timing. Its owner may pass a Pace
// function that decides, from each probe's error, how long to wait before
// the next probe (the supervisor backs off plugins that violate the gRPC
// protocol this way) and why. The backoff state stays with the owner: the
// Monitor keeps only the latest health, which it needs to detect
// transitions, and hands every result to OnProbe.
package heartbeat
