//go:build !nemesis_defect_leak

package nodevolumes

// defectLeak turns on a deliberate defect for the nemesis soak's own tests
// (test/nemesis, TestDefects), which show that the soak's checks catch it:
// every mount leaves ten goroutines blocked for good. It is true only in a
// build with the tag nemesis_defect_leak; never enable it otherwise.
const defectLeak = false
