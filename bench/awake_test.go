package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// haltUsage sums, over every core, how often it entered an idle state
// deeper than polling (cpuidle's state usage counters).
func haltUsage(t *testing.T) (uint64, bool) {
	t.Helper()
	var sum uint64
	found := false
	states, _ := filepath.Glob("/sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*")
	for _, s := range states {
		name, _ := os.ReadFile(s + "/name")
		if strings.TrimSpace(string(name)) == "POLL" {
			continue
		}
		b, err := os.ReadFile(s + "/usage")
		if err != nil {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err == nil {
			sum += n
			found = true
		}
	}
	return sum, found
}

// While holdAwake holds, no core enters an idle state deeper than
// polling; released, they may again.
func TestHoldAwake(t *testing.T) {
	if err := awakeAvailable(); err != nil {
		t.Skip(err)
	}
	if _, ok := haltUsage(t); !ok {
		t.Skip("no cpuidle state deeper than polling here")
	}
	release, err := holdAwake()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // requests apply at each core's next idle entry
	before, _ := haltUsage(t)
	time.Sleep(300 * time.Millisecond)
	after, _ := haltUsage(t)
	release()
	if after != before {
		t.Errorf("cores entered idle states deeper than polling %d times while held awake", after-before)
	}
}
