package config

import (
	"time"

	"github.com/csisupd/csisupd/internal/retry"
)

// Retry holds the backoff policy of every retry loop of the agent. These
// are not configuration keys, so they are no part of Config: DefaultRetry
// returns them, and each component validates the policy it is given and
// never fills in one of its own.
//
// Every policy doubles its interval and jitters each wait by half of it
// either way (see package retry for why). The bases and caps are those the
// loops had before they shared a policy.
type Retry struct {
	// PluginRedial spaces the supervision connection's redials while a
	// plugin's socket refuses connections, for calls that wait for it to
	// be ready. Plugins bind their socket a moment before they listen, so
	// the first retries come quickly: the first after a quarter of a
	// millisecond, doubling to the cap. A new socket's file event often
	// beats its listen (make bench's discovery shows first dials refused),
	// and the wait is part of the plugin's discovery. The base is kept under a millisecond, jitter included:
	// the Go runtime sleeps in whole milliseconds while it waits for a
	// timer, so a first wait of 1.1 ms costs 2.
	PluginRedial retry.Policy
	// Fingerprint spaces the fingerprint attempts of a plugin that has not
	// answered yet. Its Cap is a runtime value: the supervisor replaces it
	// with the probe interval in force (and lowers Base to it when the
	// interval is shorter), so a plugin that does not answer is tried about
	// as often as it would be probed. The Cap here is the default probe
	// interval, for completeness.
	Fingerprint retry.Policy
	// ClientCSI spaces ClientCSI's attempts at a plugin call that failed
	// with Unavailable, ResourceExhausted or DeadlineExceeded. Three
	// attempts at most make two waits, 100 ms and 200 ms before jitter, so
	// the cap is the second.
	ClientCSI retry.Policy
	// ConsulSync spaces the Consul syncer's passes after a failed one.
	ConsulSync retry.Policy
	// ServerJoin spaces a server's join and bootstrap attempts and the
	// checks of its address record, which go on for the server's life, and
	// the new leader's barrier retries. It does not grow: retry_join asks
	// a few servers, and cluster formation waits for the slowest of them.
	// Its Base is also autopilot's reconcile and update interval.
	ServerJoin retry.Policy
	// NodeClient spaces the node client's calls to the servers after a
	// failed one: registration, heartbeats and plugin updates.
	NodeClient retry.Policy
	// KubeletRegistration spaces the GetInfo attempts at one kubelet
	// registration socket that does not answer, or answers garbage (a
	// stale socket, a hung or broken registrar). The registry caps each
	// wait at one minute, the Cap here.
	KubeletRegistration retry.Policy
	// ServerConnect spaces gRPC's reconnects of the connections to the
	// servers (from servers and node clients) and to agents: a restarted
	// server is reached again within seconds, not gRPC's default two
	// minutes. It grows by 1.6 and is jittered by a fifth, as gRPC's own
	// default is.
	ServerConnect retry.Policy
}

// jitter is the randomization factor of every default policy.
const jitter = 0.5

// DefaultRetry returns the default backoff policies.
func DefaultRetry() Retry {
	policy := func(base, limit time.Duration) retry.Policy {
		return retry.Policy{Base: base, Cap: limit, Multiplier: 2, Jitter: jitter}
	}
	return Retry{
		PluginRedial:  policy(250*time.Microsecond, 100*time.Millisecond),
		Fingerprint:   policy(50*time.Millisecond, DefaultProbeInterval),
		ClientCSI:     policy(100*time.Millisecond, 200*time.Millisecond),
		ConsulSync:    policy(time.Second, 30*time.Second),
		ServerJoin:    policy(2*time.Second, 2*time.Second),
		NodeClient:    policy(500*time.Millisecond, 30*time.Second),
		ServerConnect: retry.Policy{Base: 100 * time.Millisecond, Cap: 3 * time.Second, Multiplier: 1.6, Jitter: 0.2},

		// A registrar answers at once or is broken: kubelet itself
		// tries a registration socket once per change of it, and every
		// attempt at one costs a gRPC connection (one to two
		// milliseconds of CPU), so hundreds of broken ones must be asked
		// rarely: with 220 of them, waits from 10 s cost the agent up to
		// 2.1 % of a core in the half minute after the first round,
		// from 20 s about half of that.
		KubeletRegistration: policy(20*time.Second, time.Minute),
	}
}
