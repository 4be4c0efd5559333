//go:build nemesis_defect_forget_record

package nodevolumes

// defectForgetRecord turns on a deliberate defect for the nemesis soak's
// own tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: the agent starts without its mount records and answers an
// unmount it has no record of as done, without unpublishing or unstaging.
// It is true only in a build with the tag nemesis_defect_forget_record;
// never enable it otherwise.
const defectForgetRecord = true
