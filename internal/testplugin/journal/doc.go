// Package journal reads the call journals of test plugins
// (testplugin.Config.Journal) and checks invariants on them: evidence
// written by the plugins themselves, not by csisupd, of what was staged
// and published where and when. It is imported by tests and test tools
// only.
//
// # Reading
//
// Read parses one journal file and Merge several (one per plugin process,
// on several nodes) into one list ordered by time. A process killed while
// writing can leave a torn record: the last line cut short, or such a line
// that a restarted plugin terminated before appending its own records.
// Read skips torn records and reports them with an error matching
// ErrTornLine alongside the records; any other bad line fails the read
// with an error naming the file and line. A torn record never hides an
// effect a caller saw: a record is synced before the call goes on, and a
// call that lost its end record still has its begin record.
//
// # Intervals
//
// The checks pair the begin and end records of each call (by Instance and
// Call) and turn node calls into intervals per node, volume and path:
//
//   - A NodePublishVolume that succeeded, or whose outcome is unknown
//     (begin record without end record: the plugin died or could not
//     journal the end), makes the volume published at its target path on
//     the writer's node (Record.Node) from the time of its begin record,
//     unless it is already published there (a repeated publish keeps the
//     interval open).
//   - A NodeUnpublishVolume of the same volume, node and target path that
//     succeeded, or that the plugin answered NotFound (it holds nothing
//     there: a stage or publish of unknown outcome had not happened), ends
//     the interval at the time of its end record, provided it certainly
//     came after the publish's effect: it began once the publish had
//     ended, or, for a publish that never ended, in a restarted plugin. A
//     plugin may act late, after its caller gave up, so an unpublish made
//     while the publish was still running may have come first. Other
//     failed calls, and unpublishes of unknown outcome, change nothing.
//   - NodeStageVolume and NodeUnstageVolume make staged intervals the same
//     way, by staging path.
//
// Calls of one key are taken in the order of their begin records.
// Intervals are half-open: one that ends at the instant another begins
// does not overlap it. The intervals are conservative: an effect counts
// from before it could have happened until after it was certainly undone,
// so a check can flag an overlap that did not happen, never miss one that
// did.
//
// # Checks
//
// SingleWriter flags two read-write publications (readonly unset and an
// access mode that is not a *_READER_ONLY one) of one volume on different
// nodes at the same time, when either has a single-writer access mode
// (SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER,
// MULTI_NODE_SINGLE_WRITER). SingleNode flags a volume staged or published
// on two nodes at the same time when either interval has a single-node
// access mode (SINGLE_NODE_*). Leftovers compares the intervals still
// open at the end of the journal with the claims a caller says are held.
// Each returns Violations naming the records that show them.
package journal
