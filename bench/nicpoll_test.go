package bench

import (
	"strings"
	"testing"

	"github.com/lanesnet/lanes/bench/results"
)

func TestPrismAside(t *testing.T) {
	type aside struct {
		On bool `json:"on"`
	}
	type high struct {
		Aside *aside `json:"aside,omitempty"`
	}
	for _, c := range []struct {
		status  any
		on, ok  bool
		comment string
	}{
		{map[string]any{"high_auto": high{Aside: &aside{On: true}}}, true, true, "prism-batch's guard"},
		{map[string]any{"guard": map[string]any{"high_auto": high{Aside: &aside{}}}}, false, true, "prism-sync's agent"},
		{map[string]any{"high_auto": high{}}, false, false, "aside off"},
		{map[string]any{"balancer": 1}, false, false, "falcon"},
	} {
		on, ok := prismAside(c.status)
		if on != c.on || ok != c.ok {
			t.Errorf("%s: aside %v (%v), want %v (%v)", c.comment, on, ok, c.on, c.ok)
		}
	}
}

func TestDepthNote(t *testing.T) {
	run := func(mode string, bg, d float64, aside int) results.Run {
		r := results.Run{Mode: mode, Workload: "prio_latency", Proto: "udp", MsgSize: 64, Background: bg, Awake: true, Extra: map[string]float64{"nic_frames_per_poll": d}}
		if aside >= 0 {
			r.Extra["prism_aside_at_end"] = float64(aside)
		}
		return r
	}
	if n := depthNote([]results.Run{{Mode: "vanilla", Workload: "prio_latency"}}); n != "" {
		t.Errorf("nothing counted: note %q", n)
	}
	n := depthNote([]results.Run{
		run("vanilla", 0.3, 1.2, -1), run("prism-batch", 0.3, 1.1, 1), run("vanilla", 0.3, 1.4, -1), run("prism-batch", 0.3, 2.9, 0), run("vanilla", 0.3, 1.3, -1),
		run("vanilla", 0.65, 2.8, -1), run("prism-batch", 0.65, 3.6, 0),
	})
	for _, want := range []string{"vanilla 1.30 [1.20-1.40]", "prism-batch 2.00 [1.10-2.90] (aside at the end of 1 of 2)", "prism-batch 3.60 [3.60-3.60] (aside at the end of 0 of 1)"} {
		if !strings.Contains(n, want) {
			t.Errorf("note %q lacks %q", n, want)
		}
	}
	if i, j := strings.Index(n, "bg30%"), strings.Index(n, "bg65%"); i < 0 || j < i {
		t.Errorf("note %q: points out of order", n)
	}
}
