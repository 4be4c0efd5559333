// Package deploy holds the tests of deploy/: the Prometheus rules and the
// Grafana dashboard parse and name only the metrics that the Metrics
// table of docs/operations.md documents, the alerts fire on the states they are named after, and
// systemd accepts the units. The plugin examples of deploy/plugins/ are
// checked against what `csisupd plugin mounts` computes, and podman
// accepts those mounts. The podman examples of deploy/podman/ are checked
// against podman-systemd.unit(5), and podman.go reads them for the tests
// here and for test/e2e, which runs them against a real agent.
package deploy
