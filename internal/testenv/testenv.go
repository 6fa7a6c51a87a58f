// Package testenv says whether a test can run here. Integration tests
// need root and the running kernel (namespaces, BPF programs, sysfs and
// procfs writes); -short leaves them out, which is how `make unit` runs
// the rest as an unprivileged user.
package testenv

import (
	"os"
	"testing"
)

// Root skips t under -short, and when not running as root.
func Root(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (root, the running kernel): left out by -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}
