//go:build race

package soak

// raceEnabled is true when the tests run with the race detector; the agent
// under test is then built with it too.
const raceEnabled = true
