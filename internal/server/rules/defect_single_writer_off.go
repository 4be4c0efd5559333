//go:build !nemesis_defect_single_writer

package rules

// defectSingleWriter turns on a deliberate defect for the nemesis soak's
// own tests (test/nemesis, TestDefects), which show that the soak's checks
// catch it: the access-mode check lets a second writer on another node
// take a single-writer or single-node volume. It is true only in a build
// with the tag nemesis_defect_single_writer; never enable it otherwise.
const defectSingleWriter = false
