// Package docs holds the tests of the documentation: every relative link
// of README.md and docs/*.md names a file that exists and, with a
// fragment, a heading (or an HTML anchor) of that file.
package docs
