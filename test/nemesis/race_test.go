//go:build nemesis && race

package nemesis

// raceEnabled is true when the tests run with the race detector; csisupd
// is then built with it too.
const raceEnabled = true
