// Package fingerprint asks a CSI plugin who it is and what it can do.
//
// Take is a pure function of the plugin's answers: it starts no goroutines
// and keeps no state, so callers decide when to fingerprint again.
package fingerprint
