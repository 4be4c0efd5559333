//go:build fault

package fsm

// propertySchedules is the number of random schedules of the claim
// property test: the full count, with the fault tests.
const propertySchedules = 10000
