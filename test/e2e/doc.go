// Package e2e tests csisupd end to end: the real binary in --dev mode, and
// clusters of real servers and agents (internal/testcluster) driven through
// the real CLI. Long fault scenarios are behind the "fault" build tag.
package e2e
