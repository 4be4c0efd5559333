//go:build nemesis_defect_skip_unpublish

package nodevolumes

// defectSkipUnpublish turns on a deliberate defect for the nemesis soak's
// own tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: the agent releases a mount without calling
// NodeUnpublishVolume. It is true only in a build with the tag
// nemesis_defect_skip_unpublish; never enable it otherwise.
const defectSkipUnpublish = true
