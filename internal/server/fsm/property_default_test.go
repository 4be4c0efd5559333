//go:build !fault

package fsm

// propertySchedules is the number of random schedules of the claim
// property test in the default run; the fault tests run 10,000.
const propertySchedules = 1000
