//go:build nemesis_defect_busy_release

package nodevolumes

// defectBusyRelease turns on a deliberate defect for the nemesis soak's
// own tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: the agent refuses to release a mount while another mount on
// the node shares its staging, so two workloads of one volume on a node
// hold each other's release off for good (a volume stuck "in use"). It is
// true only in a build with the tag nemesis_defect_busy_release; never
// enable it otherwise.
const defectBusyRelease = true
