//go:build !nemesis_defect_lease_never_expires

package leader

// defectLeaseNeverExpires turns on a deliberate defect for the nemesis
// soak's own tests (test/nemesis, TestDefects), which show that the soak's
// checks catch it: the leader's lease timers never expire a lease, so a
// leased claim that is no longer renewed stays taken. It is true only in a
// build with the tag nemesis_defect_lease_never_expires; never enable it
// otherwise.
const defectLeaseNeverExpires = false
