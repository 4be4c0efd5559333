// Package retry is the one backoff policy of csisupd's retry loops: the
// supervision connection's redial, the fingerprint retry of a plugin
// supervisor, ClientCSI's retries, the Consul syncer, the node client and
// server join.
//
// A Policy is a plain value: Base, Cap, Multiplier and Jitter. Its
// defaults live in the config package (config.Retry); a component takes a
// Policy in its config struct, checks it with Validate and never fills in
// one of its own. Each loop gets its own state from NewBackOff, asks it
// for the next wait after every failure and resets it after a success.
// Wait sleeps for one such wait, and returns early when the context ends.
//
// The arithmetic is github.com/cenkalti/backoff/v5's ExponentialBackOff:
// the interval starts at Base and is multiplied by Multiplier after every
// wait, up to Cap; each wait is drawn uniformly from
// [interval*(1-Jitter), interval*(1+Jitter)]. Cap bounds the interval
// before jitter, as in gRPC's connection backoff, so a wait is at most
// Cap*(1+Jitter). The state never gives up: NextBackOff never returns
// backoff.Stop (v5 keeps the elapsed-time limit in its Retry function,
// which is not used here), so a loop that retries forever does, and a loop
// that stops after some attempts counts them itself.
//
// # Why proportional jitter
//
// The herd this package exists for is every agent re-registering with a
// server that just restarted: they all fail at the same instant, so what
// spreads them is the jitter of their first retry, before any growth. Two
// shapes are common. Full jitter draws a wait from [0, interval]; it
// spreads the first retry over one Base, but some loops retry at once (a
// wait near zero, hitting a server that is still down) and the mean wait
// is halved. Proportional jitter with a factor of one half, the defaults
// chosen here, draws the first wait from [Base/2, 3*Base/2]: a spread just
// as wide, one whole Base, around the loop's own schedule, so the mean
// wait and the growth stay what the policy says and no loop retries sooner
// than half its Base. Later waits spread the same proportion of a longer
// interval, so loops that met once drift further apart with every retry.
//
// The random draws come from math/rand/v2's generator, which every process
// seeds on its own: agents on different machines, and loops in one
// process, never share a sequence.
package retry
