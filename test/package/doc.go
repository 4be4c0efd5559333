// Package pkgtest checks make package's artefacts as an operator meets
// them: built twice the same, installed with dpkg, the unit verified, the
// installed agent started from /etc/csisupd.d and stopped, removed and
// purged, the .rpm read back. It installs a package on the machine, so its
// tests have a build tag of their own ("package", make test-package) and
// need root and dpkg; CI runs them.
package pkgtest
