// Package deploy holds the tests of deploy/: the Prometheus rules and the
// Grafana dashboard parse and name only the metrics the README's Metrics
// table documents, the alerts fire on the states they are named after, and
// systemd accepts the units. The plugin examples of deploy/plugins/ are
// checked against what `csisupd plugin mounts` computes, and podman
// accepts those mounts. It has no code of its own.
package deploy
