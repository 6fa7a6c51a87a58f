package steer

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	valid := Config{Enabled: true, CPUs: []int{3, 1}, Flowlet: time.Millisecond, VXLANPort: 4789, VNIs: []uint32{7, 5, 7}}
	tooMany := make([]int, MaxCPUs+1)
	for i := range tooMany {
		tooMany[i] = i
	}
	for name, tc := range map[string]struct {
		mutate func(*Config)
		err    string
	}{
		"no cores":         {func(c *Config) { c.CPUs = nil }, "no cores"},
		"65 cores":         {func(c *Config) { c.CPUs = tooMany }, "at most 64"},
		"duplicate core":   {func(c *Config) { c.CPUs = []int{2, 1, 2} }, "core 2 listed twice"},
		"core 64":          {func(c *Config) { c.CPUs = []int{64} }, "core 64"},
		"negative core":    {func(c *Config) { c.CPUs = []int{-1} }, "core -1"},
		"port 0":           {func(c *Config) { c.VXLANPort = 0 }, "port 0"},
		"negative flowlet": {func(c *Config) { c.Flowlet = -time.Second }, "negative"},
		"VNI too wide":     {func(c *Config) { c.VNIs = []uint32{1 << 24} }, "24 bits"},
		"batch 0":          {func(c *Config) { c.MFlow = MFlow{At: SplitAtIRQ, Cores: []int{1}, Window: time.Second} }, "batch 0"},
		"batch too big": {func(c *Config) {
			c.MFlow = MFlow{At: SplitAtIRQ, Batch: MaxBatch + 1, Cores: []int{1}, Window: time.Second}
		}, "want 1..65536"},
		"no split cores":        {func(c *Config) { c.MFlow = MFlow{At: SplitAtBridge, Batch: 1, Window: time.Second} }, "no split cores"},
		"split core not in set": {func(c *Config) { c.MFlow = MFlow{At: SplitAtIRQ, Batch: 1, Cores: []int{2}, Window: time.Second} }, "split core 2 is not among"},
		"split core twice":      {func(c *Config) { c.MFlow = MFlow{At: SplitAtIRQ, Batch: 1, Cores: []int{3, 3}, Window: time.Second} }, "split core 3 listed twice"},
		"no window":             {func(c *Config) { c.MFlow = MFlow{At: SplitAtIRQ, Batch: 1, Cores: []int{3}} }, "window 0s"},
		"unknown split":         {func(c *Config) { c.MFlow = MFlow{At: 7, Batch: 1, Cores: []int{3}, Window: time.Second} }, "want irq or bridge"},
		"quiet under 1ms": {func(c *Config) {
			c.MFlow = MFlow{At: SplitAtIRQ, Batch: 1, Cores: []int{3}, Window: time.Second, Quiet: time.Microsecond}
		}, "quiet time 1µs"},
		"fast path with micro-flows": {func(c *Config) {
			c.Fast, c.FastIdle = true, time.Second
			c.MFlow = MFlow{At: SplitAtIRQ, Batch: 1, Cores: []int{3}, Window: time.Second}
		}, "beside neither micro-flows"},
		"beside without the fast path": {func(c *Config) { c.FastBeside = true }, "needs the fast path"},
		"fast path with sync":          {func(c *Config) { c.Fast, c.FastIdle, c.Prio, c.Sync = true, time.Second, true, true }, "nor PRISM-sync"},
		"inline core not steered to": {func(c *Config) {
			c.Prio, c.CountSplit, c.PrioIdleInline, c.InlineCPU = true, true, true, 7
		}, "bulk inline while idle on core 7"},
	} {
		c := valid
		tc.mutate(&c)
		if _, err := c.normalized(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.err)
		}
	}

	n, err := valid.normalized()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.CPUs, []int{1, 3}) || !slices.Equal(n.VNIs, []uint32{5, 7}) {
		t.Errorf("normalized %+v: want cores [1 3], VNIs [5 7]", n)
	}
	if !slices.Equal(valid.CPUs, []int{3, 1}) {
		t.Error("normalizing changed the caller's slice")
	}
	all := valid
	all.CPUs = tooMany[:MaxCPUs]
	if _, err := all.normalized(); err != nil {
		t.Errorf("64 cores: %v", err)
	}
}
