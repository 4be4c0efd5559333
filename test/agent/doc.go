// Package agent holds the end-to-end tests of the csisupd node agent: they
// build the real csisupd binary and the csi-testplugin command, and drive
// them as an operator would, over real ports and unix sockets.
package agent
