package bench

import (
	"os"
	"testing"

	"github.com/lanesnet/lanes/bench/workload"
)

// TestMain lets the test binary serve as the paced ping-pong client the
// priority workloads start (workload.RunHelper), as the lanes binary does.
func TestMain(m *testing.M) {
	workload.RunHelper()
	os.Exit(m.Run())
}
