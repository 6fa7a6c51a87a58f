package prism_test

import (
	"testing"

	"github.com/lanesnet/lanes/policy/prism"
)

// bulk-sched defaults to idle, and to normal where idle would be refused
// or has nothing to set; given explicitly it is kept.
func TestBulkSchedDefault(t *testing.T) {
	for _, tc := range []struct {
		params map[string]string
		want   string
	}{
		{map[string]string{}, prism.SchedIdle},
		{map[string]string{"prio-mode": "sync"}, prism.SchedIdle},
		{map[string]string{"high-rt": "0"}, prism.SchedIdle},
		{map[string]string{"guard-nice": "19"}, prism.SchedIdle},
		{map[string]string{"high": "inline"}, prism.SchedIdle},
		{map[string]string{"bulk": "inline"}, prism.SchedNormal},
		{map[string]string{"streamline": "true"}, prism.SchedNormal},
		{map[string]string{"bulk-rt": "10"}, prism.SchedNormal},
		{map[string]string{"bulk-sched": "normal"}, prism.SchedNormal},
		{map[string]string{"bulk-sched": "batch"}, prism.SchedBatch},
	} {
		o, err := prism.Parse(prism.Defaults(), tc.params)
		if err != nil {
			t.Errorf("%v: %v", tc.params, err)
			continue
		}
		if o.BulkSched != tc.want {
			t.Errorf("%v: bulk-sched %q, want %q", tc.params, o.BulkSched, tc.want)
		}
	}
	if _, err := prism.Parse(prism.Defaults(), map[string]string{"bulk-sched": ""}); err == nil {
		t.Error("bulk-sched= (empty) accepted")
	}
}
