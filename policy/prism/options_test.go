package prism_test

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
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

// guard-tasks: the default share, any percent with bulk-sched=idle, a
// one-line error for anything else.
func TestParseGuardTasks(t *testing.T) {
	if o, err := prism.Parse(prism.Defaults(), nil); err != nil || o.GuardTasks != prism.DefaultGuardTasks {
		t.Errorf("default guard-tasks %v (%v), want %v", o.GuardTasks, err, prism.DefaultGuardTasks)
	}
	for v, want := range map[string]float64{"0": 0, "12.5": 12.5, "100": 100} {
		if o, err := prism.Parse(prism.Defaults(), map[string]string{"guard-tasks": v}); err != nil || o.GuardTasks != want {
			t.Errorf("guard-tasks=%s: %v (%v), want %v", v, o.GuardTasks, err, want)
		}
	}
	parseRefuses(t, map[string]map[string]string{
		"want a percent from 0 to 100":            {"guard-tasks": "101"},
		"bad prism setting guard-tasks":           {"guard-tasks": "-1"},
		"want a percent":                          {"guard-tasks": "NaN"},
		"drop guard-tasks or set bulk-sched=idle": {"guard-tasks": "10", "bulk-sched": "normal"},
	})
}

// sync-netfilter is gone, whatever its value: Parse refuses it with one
// line saying what replaced it (PRISM-sync takes the shortcut only where
// no netfilter table can see the overlay's frames), and so does every
// prism mode's setting check, which the command line and the config file
// go through.
func TestSyncNetfilterRetired(t *testing.T) {
	for _, params := range []map[string]string{
		{"prio-mode": "sync", "sync-netfilter": "trust"},
		{"prio-mode": "sync", "sync-netfilter": "check"},
		{"sync-netfilter": "trust"},
		{"sync-netfilter": "yes"},
	} {
		_, err := prism.Parse(prism.Defaults(), params)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "no netfilter table") || !strings.Contains(err.Error(), "remove the setting") {
			t.Errorf("%v: %v, want one line naming what replaced sync-netfilter", params, err)
		}
		for _, mode := range []string{"prism", "prism-sync", "prism-batch"} {
			p, err := plan.Lookup(mode)
			if err != nil {
				t.Fatal(err)
			}
			if cerr := plan.CheckParams(p, params); cerr == nil || !strings.Contains(cerr.Error(), "no netfilter table") {
				t.Errorf("mode %s, %v: setting check says %v", mode, params, cerr)
			}
		}
	}
}

// quiet: off by default, whole milliseconds up to an hour, and only where
// bulk can move between the NIC poll and its queue.
func TestParseQuiet(t *testing.T) {
	if o, err := prism.Parse(prism.Defaults(), nil); err != nil || o.Quiet != 0 {
		t.Errorf("default quiet %v (%v), want off", o.Quiet, err)
	}
	for v, want := range map[string]time.Duration{"1s": time.Second, "0": 0, "250ms": 250 * time.Millisecond} {
		if o, err := prism.Parse(prism.Defaults(), map[string]string{"quiet": v}); err != nil || o.Quiet != want {
			t.Errorf("quiet=%s: %v (%v), want %v", v, o.Quiet, err, want)
		}
	}
	parseRefuses(t, map[string]map[string]string{
		"whole milliseconds from 1ms to 1h": {"quiet": "500us"},
		"from 1ms to 1h":                    {"quiet": "2h"},
		"invalid duration":                  {"quiet": "soon"},
		"needs bulk=queue or auto and high": {"quiet": "1s", "bulk": "inline"},
		"drop quiet or the inline setting":  {"quiet": "1s", "high": "inline"},
	})
}

func TestParseHighAuto(t *testing.T) {
	if o, err := prism.Parse(prism.Defaults(), nil); err != nil || o.High != prism.HighAuto {
		t.Errorf("default high %q (%v), want auto", o.High, err)
	}
	if o, err := prism.Parse(prism.Defaults(), map[string]string{"bulk": "inline"}); err != nil || o.High != prism.HighQueue {
		t.Errorf("default high with bulk=inline %q (%v), want queue (auto has no move to make)", o.High, err)
	}
	// bulk follows high: auto with high=auto, the queue otherwise.
	for params, want := range map[string]string{"": prism.BulkAuto, "high=auto": prism.BulkAuto, "high=queue": prism.BulkQueue, "high=inline": prism.BulkQueue, "bulk=queue": prism.BulkQueue, "streamline=true": prism.BulkQueue} {
		m := map[string]string{}
		if k, v, ok := strings.Cut(params, "="); ok {
			m[k] = v
		}
		if o, err := prism.Parse(prism.Defaults(), m); err != nil || o.Bulk != want {
			t.Errorf("%q: bulk %q (%v), want %s", params, o.Bulk, err, want)
		}
	}
	o, err := prism.Parse(prism.Defaults(), map[string]string{"high": "auto"})
	if err != nil || o.High != prism.HighAuto || o.HighAutoPPS != 5000 {
		t.Errorf("high=auto: %+v (%v), want auto at 5000 frames/s", o, err)
	}
	if o, err := prism.Parse(prism.Defaults(), map[string]string{"high": "auto", "high-auto-pps": "20000"}); err != nil || o.HighAutoPPS != 20000 {
		t.Errorf("high-auto-pps=20000: %d (%v)", o.HighAutoPPS, err)
	}
	if o.BulkQuiet != 20*time.Millisecond {
		t.Errorf("default bulk-quiet %v, want 20ms", o.BulkQuiet)
	}
	if o, err := prism.Parse(prism.Defaults(), map[string]string{"bulk-quiet": "0"}); err != nil || o.BulkQuiet != 0 || o.High != prism.HighAuto {
		t.Errorf("bulk-quiet=0: %v, high %s (%v)", o.BulkQuiet, o.High, err)
	}
	if o, err := prism.Parse(prism.Defaults(), map[string]string{"high": "queue", "bulk-quiet": "0"}); err != nil || o.High != prism.HighQueue {
		t.Errorf("high=queue bulk-quiet=0: high %s (%v)", o.High, err)
	}
	parseRefuses(t, map[string]map[string]string{
		"want queue, inline or auto":          {"high": "sometimes"},
		"from 10 to 100000000":                {"high": "auto", "high-auto-pps": "5"},
		"invalid syntax":                      {"high": "auto", "high-auto-pps": "lots"},
		"drop high-auto-pps or set high=auto": {"high": "queue", "high-auto-pps": "1000"},
		"bulk=inline leaves no such move":     {"high": "auto", "bulk": "inline"},
		"starving them: use bulk=queue":       {"bulk": "auto", "streamline": "true"},
		"drop bulk-quiet or set high=auto":    {"high": "queue", "bulk-quiet": "50ms"},
		"whole milliseconds from 1ms to 1h":   {"bulk-quiet": "1500us"},
		"high=auto (implied by bulk-quiet)":   {"bulk-quiet": "50ms", "bulk": "inline"},
	})
}

// parseRefuses: Parse refuses each params with an error saying msg.
func parseRefuses(t *testing.T, cases map[string]map[string]string) {
	t.Helper()
	for msg, params := range cases {
		if _, err := prism.Parse(prism.Defaults(), params); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%v: error %v, want one saying %q", params, err, msg)
		}
	}
}

// netdev-budget: off by default, frames up to 100000, and only with a
// high-priority queue to take the core.
func TestParseNetdevBudget(t *testing.T) {
	if o, err := prism.Parse(prism.Defaults(), nil); err != nil || o.NetdevBudget != 0 {
		t.Errorf("default netdev-budget %v (%v), want 0 (left as it is)", o.NetdevBudget, err)
	}
	if o, err := prism.Parse(prism.Defaults(), map[string]string{"netdev-budget": "64"}); err != nil || o.NetdevBudget != 64 {
		t.Errorf("netdev-budget=64: %v (%v)", o.NetdevBudget, err)
	}
	parseRefuses(t, map[string]map[string]string{
		"want 0 (leave it as it is) or frames from 1 to 100000": {"netdev-budget": "-1"},
		"from 1 to 100000":  {"netdev-budget": "100001"},
		"invalid syntax":    {"netdev-budget": "many"},
		"has no such queue": {"netdev-budget": "64", "high": "inline"},
	})
}

// aside-below: the default with high=auto and bulk=auto, off where they
// are not (nothing to step aside with), any percent given with them, a
// one-line error otherwise.
func TestParseAsideBelow(t *testing.T) {
	for _, tc := range []struct {
		params map[string]string
		want   int
	}{
		{nil, prism.DefaultAsideBelow},
		{map[string]string{"prio-mode": "sync"}, prism.DefaultAsideBelow},
		{map[string]string{"aside-below": "35"}, 35},
		{map[string]string{"aside-below": "0"}, 0},
		{map[string]string{"high": "queue"}, 0},
		{map[string]string{"bulk": "queue"}, 0},
		{map[string]string{"high": "queue", "aside-below": "0"}, 0},
	} {
		o, err := prism.Parse(prism.Defaults(), tc.params)
		if err != nil || o.AsideBelow != tc.want {
			t.Errorf("%v: aside-below %v (%v), want %v", tc.params, o.AsideBelow, err, tc.want)
		}
	}
	parseRefuses(t, map[string]map[string]string{
		"want a whole percent from 0 (off) to 100":          {"aside-below": "101"},
		"bad prism setting aside-below":                     {"aside-below": "x"},
		"drop aside-below or use high=auto and bulk=auto":   {"aside-below": "20", "high": "queue"},
		"but high is auto and bulk queue: drop aside-below": {"aside-below": "20", "bulk": "queue"},
	})
}

func TestParseAsideDepth(t *testing.T) {
	for _, tc := range []struct {
		params map[string]string
		want   float64
	}{
		{nil, prism.DefaultAsideDepth},
		{map[string]string{"aside-depth": "1.5"}, 1.5},
		{map[string]string{"aside-depth": "0"}, 0},
		{map[string]string{"aside-below": "0"}, 0}, // stepping aside off
		{map[string]string{"bulk": "queue"}, 0},
	} {
		o, err := prism.Parse(prism.Defaults(), tc.params)
		if err != nil || o.AsideDepth != tc.want {
			t.Errorf("%v: aside-depth %v (%v), want %v", tc.params, o.AsideDepth, err, tc.want)
		}
	}
	parseRefuses(t, map[string]map[string]string{
		"want 0 (receive work alone) or frames per poll from 1 to 64": {"aside-depth": "0.5"},
		"frames per poll from 1 to 64":                                {"aside-depth": "65"},
		"bad prism setting aside-depth":                               {"aside-depth": "x"},
		"stepping aside is off (aside-below=0":                        {"aside-depth": "2", "aside-below": "0"},
		"drop aside-depth or turn aside-below on":                     {"aside-depth": "2", "high": "queue"},
	})
}
