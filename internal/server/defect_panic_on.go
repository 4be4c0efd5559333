//go:build nemesis_defect_panic

package server

// defectPanic turns on a deliberate defect for the nemesis soak's own
// tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: the server panics on its 25th release. It is true only in a
// build with the tag nemesis_defect_panic; never enable it otherwise.
const defectPanic = true
