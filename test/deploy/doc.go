// Package deploy holds the tests of deploy/: the Prometheus rules and the
// Grafana dashboard parse and name only the metrics the README's Metrics
// table documents, the alerts fire on the states they are named after, and
// systemd accepts the unit. It has no code of its own.
package deploy
