// Package upgrade tests that a cluster made by an earlier release comes up
// under the code being tested: the data_dirs of three servers and a
// snapshot file written by that release are kept in testdata, and the
// tests start real `csisupd agent` processes from them, at the addresses
// the release recorded in its raft configuration, and compare what the
// public API answers with what the release answered before it stopped.
//
// They compare only through the CLI's --json output, never through the
// storage format, so that they hold across a change of that format. The
// fixture is made by TestMakeFixture (build tag fixture); testdata's
// README says how.
package upgrade
