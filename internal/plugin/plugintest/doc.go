// Package plugintest provides a plugin.Source whose plugins a test sets,
// for tests of the consumers of plugin state that need no plugin
// processes. Only tests import it.
package plugintest
