package workload

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as the paced ping-pong client
// (RunHelper), as the lanes binary does.
func TestMain(m *testing.M) {
	RunHelper()
	os.Exit(m.Run())
}
