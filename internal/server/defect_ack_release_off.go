//go:build !nemesis_defect_ack_release

package server

// defectAckRelease turns on a deliberate defect for the nemesis soak's own
// tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: Control.ReleaseVolume acknowledges the release of a workload's
// claim without doing it. It is true only in a build with the tag
// nemesis_defect_ack_release; never enable it otherwise.
const defectAckRelease = false
