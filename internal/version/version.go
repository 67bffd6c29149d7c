// Package version holds the build's version, set by the linker (see the Makefile's LDFLAGS).
package version

// Version is the release or git description of this build.
var Version = "dev"
