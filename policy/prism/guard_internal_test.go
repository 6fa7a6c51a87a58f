package prism

import (
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// TestBulkWaitShare: the bulk kthread's wait is a share of the time between
// two reads, whatever interval the sampler reports, and never above 100%
// (a guard delayed on its busy core once logged "waited 111%").
func TestBulkWaitShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var clock time.Time
	var wait uint64
	b := &bulkTarget{
		threads:  []knobs.KthreadInfo{{PID: 42, Comm: "cpumap/1/map:7"}},
		wait:     map[int]uint64{},
		now:      func() time.Time { return clock },
		readWait: func(int) (uint64, error) { return wait, nil },
	}
	const interval = 40 * time.Millisecond // what the sampler says
	for i, step := range []struct {
		advance time.Duration // clock since the last read
		waited  time.Duration // the kthread's wait since the last read
		want    float64
	}{
		{0, 0, 0}, // first read: no share yet
		{40 * time.Millisecond, 20 * time.Millisecond, 50},  // on time
		{time.Second, 500 * time.Millisecond, 50},           // the guard was late: 500 ms of 1 s, not of 40 ms
		{10 * time.Millisecond, 11 * time.Millisecond, 100}, // schedstat ahead of the clock: capped
		{40 * time.Millisecond, 0, 0},
	} {
		if i == 0 {
			clock = t0
		}
		clock = clock.Add(step.advance)
		wait += uint64(step.waited)
		got, err := b.signal(nil, interval)
		if err != nil {
			t.Fatal(err)
		}
		if got != step.want {
			t.Errorf("read %d: %.1f%%, want %.1f%%", i, got, step.want)
		}
	}
}
