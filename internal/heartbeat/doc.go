// Package heartbeat probes one CSI plugin and keeps its health state machine.
//
// A Monitor sends Probe every interval and also whenever its owner calls
// ProbeNow — the supervisor does so the moment the plugin's connection
// breaks — so a dead plugin is noticed within milliseconds instead of at the
// next probe. Each probe's Result (healthy or unhealthy, and why) goes to
// the owner, which holds the plugin's one Health and applies the result
// with Health.Apply: Health moves between unknown, healthy and unhealthy,
// only moves between states are transitions, and steady state has none.
//
// A Monitor runs on a goroutine of its own (Run), or, many together, on a
// Scheduler: it holds them in a heap between probes and runs the due
// probes on a few dozen goroutines, so a node with 1,000 plugins keeps no
// goroutine (and no stack) per plugin for probing. Probes asked for with
// ProbeNow, and scheduled probes that waited too long for a free
// goroutine, get one of their own, so a plugin that hangs holds no other
// plugin's probe back.
//
// Scheduled probes fall due on a shared 250 ms grid of the clock (see
// alignedWait): the probes of a node's plugins then wake the agent a few
// times a second together rather than each on its own, which costs a third
// less CPU for the same probes. An interval changes by at most 125 ms and
// keeps its mean; ProbeNow is never delayed.
//
// The Monitor holds no probe timing either: it reads the interval and
// timeout from its owner (Config.Timing) before every probe, so a reload
// changes them in one place. Its owner may also pass a Pace
// function that decides, from each probe's error, how long to wait before
// the next probe (the supervisor backs off plugins that violate the gRPC
// protocol this way) and why. The backoff state and the health stay with
// the owner: the Monitor keeps neither and hands every result to OnProbe,
// with the Probe call's error and duration, from which the owner counts
// failures by reason and times probes (the registry's metrics): this
// package exports no metrics of its own.
package heartbeat
