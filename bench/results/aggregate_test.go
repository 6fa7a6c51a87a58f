package results

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want Stat
	}{
		{nil, Stat{}},
		{[]float64{5}, Stat{1, 5, 5, 5}},
		{[]float64{3, 1, 2}, Stat{3, 2, 1, 3}},
		{[]float64{4, 1, 3, 2}, Stat{4, 2.5, 1, 4}}, // even: mean of the middle two
		{[]float64{7, 7, 1, 100, 7}, Stat{5, 7, 1, 100}},
	} {
		if got := Summarize(c.in); got != c.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	in := []float64{3, 1, 2}
	Summarize(in)
	if in[0] != 3 {
		t.Error("Summarize reordered its input")
	}
}

func run(mode string, msg, rep int, gbps float64) Run {
	return Run{Mode: mode, Workload: "tcp_stream", Proto: "tcp", MsgSize: msg, Flows: 1, Repeat: rep, ThroughputGbps: gbps}
}

func TestAggregate(t *testing.T) {
	f := &File{
		Modes: []string{"native", "vanilla", "rps"},
		Runs: []Run{
			run("rps", 1400, 0, 6), run("rps", 1400, 1, 9), run("rps", 1400, 2, 7),
			run("vanilla", 1400, 0, 4), run("vanilla", 1400, 1, 5), run("vanilla", 1400, 2, 3), run("vanilla", 1400, 3, 6),
			run("native", 1400, 0, 10), run("native", 1400, 1, 10),
			// 64 B: no vanilla, native failed every repeat.
			run("rps", 64, 0, 1), run("rps", 64, 1, 2),
			{Mode: "native", Workload: "tcp_stream", Proto: "tcp", MsgSize: 64, Flows: 1, Error: "iperf3 died"},
			{Mode: "vanilla", Workload: "pingpong", Proto: "tcp", MsgSize: 64, Flows: 1, LatP50Us: 30},
		},
	}
	a := f.Aggregate()
	if len(a.Groups) != 6 {
		t.Fatalf("%d groups, want 6", len(a.Groups))
	}
	// Order: workload, then point (64 before 1400), then mode order.
	var order []string
	for _, g := range a.Groups {
		order = append(order, g.Workload+"/"+g.Mode)
	}
	want := []string{"tcp_stream/native", "tcp_stream/rps", "tcp_stream/native", "tcp_stream/vanilla", "tcp_stream/rps", "pingpong/vanilla"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("group order %v, want %v", order, want)
		}
	}
	if a.Groups[0].MsgSize != 64 || a.Groups[2].MsgSize != 1400 {
		t.Errorf("points not sorted by msg size")
	}

	p := Point{Workload: "tcp_stream", Proto: "tcp", MsgSize: 1400, Flows: 1}
	rps := a.Group(Key{"rps", p})
	if s := rps.Stat(Throughput); s != (Stat{3, 7, 6, 9}) {
		t.Errorf("rps stat %+v", s)
	}
	if s := a.Group(Key{"vanilla", p}).Stat(Throughput); s != (Stat{4, 4.5, 3, 6}) {
		t.Errorf("vanilla stat %+v", s)
	}
	if r, ok := a.Ratio(Key{"rps", p}, Throughput, "vanilla"); !ok || math.Abs(r-7/4.5) > 1e-12 {
		t.Errorf("rps/vanilla = %v %v, want %v", r, ok, 7/4.5)
	}
	if r, ok := a.Ratio(Key{"rps", p}, Throughput, "native"); !ok || r != 0.7 {
		t.Errorf("rps/native = %v %v, want 0.7", r, ok)
	}
	if r, ok := a.Ratio(Key{"vanilla", p}, Throughput, "vanilla"); !ok || r != 1 {
		t.Errorf("vanilla/vanilla = %v %v", r, ok)
	}

	p64 := Point{Workload: "tcp_stream", Proto: "tcp", MsgSize: 64, Flows: 1}
	if _, ok := a.Ratio(Key{"rps", p64}, Throughput, "vanilla"); ok {
		t.Error("ratio against a missing vanilla")
	}
	if _, ok := a.Ratio(Key{"rps", p64}, Throughput, "native"); ok {
		t.Error("ratio against a native that only failed")
	}
	nat := a.Group(Key{"native", p64})
	if len(nat.Runs) != 0 || len(nat.Failed) != 1 || nat.Stat(Throughput).N != 0 {
		t.Errorf("failed native group: %+v", nat)
	}
	if _, ok := a.Ratio(Key{"nope", p64}, Throughput, "native"); ok {
		t.Error("ratio of a missing group")
	}
	// A zero baseline (latency a workload did not measure) gives no ratio.
	pp := Point{Workload: "pingpong", Proto: "tcp", MsgSize: 64, Flows: 1}
	if _, ok := a.Ratio(Key{"vanilla", pp}, Throughput, "vanilla"); ok {
		t.Error("ratio against a zero median")
	}

	if got := a.Workloads(); len(got) != 2 || got[0] != "tcp_stream" {
		t.Errorf("workloads %v", got)
	}
	if got := a.Points("tcp_stream"); len(got) != 2 || got[0].MsgSize != 64 {
		t.Errorf("points %v", got)
	}
	if got := a.ModesAt(p64); len(got) != 2 || got[0] != "native" || got[1] != "rps" {
		t.Errorf("modes at 64: %v", got)
	}
	if m := rps.MedianRun(Throughput); m == nil || m.ThroughputGbps != 7 {
		t.Errorf("median run %+v", m)
	}
}

func TestGroupCPU(t *testing.T) {
	g := &Group{Runs: []Run{
		{CPU: []CPUUse{{CPU: 1, SoftIRQ: 10, Idle: 90}, {CPU: 0, SoftIRQ: 50, Idle: 50, NetRX: 10}}},
		{CPU: []CPUUse{{CPU: 0, SoftIRQ: 70, Idle: 30, NetRX: 20}, {CPU: 1, SoftIRQ: 30, Idle: 70}}},
		{CPU: []CPUUse{{CPU: 0, SoftIRQ: 60, Idle: 40, NetRX: 30}}},
	}}
	c := g.CPU()
	if len(c) != 2 || c[0].CPU != 0 || c[0].SoftIRQ != 60 || c[0].NetRX != 20 || c[1].SoftIRQ != 20 || c[1].Idle != 80 {
		t.Errorf("CPU medians %+v", c)
	}
	if b := CPUBusy.Get(&g.Runs[0]); b != 60 {
		t.Errorf("busy %v, want 60", b)
	}
}

// StatMeasured leaves out the runs that did not measure the metric.
func TestStatMeasured(t *testing.T) {
	g := &Group{Runs: []Run{
		{Extra: map[string]float64{}},
		{Extra: map[string]float64{"work_ns_per_msg": 10}},
		{Extra: map[string]float64{"work_ns_per_msg": 20}},
	}}
	if s := g.StatMeasured(WorkPerMsg); s.N != 2 || s.Median != 15 || s.Min != 10 {
		t.Errorf("measured %+v, want 2 runs, median 15", s)
	}
	if s := g.Stat(WorkPerMsg); s.N != 3 || s.Median != 10 {
		t.Errorf("all %+v", s)
	}
}

// A run that did not record the late share is left out; one that sent
// nothing late counts as 0%.
func TestStatRecorded(t *testing.T) {
	g := &Group{Runs: []Run{{Extra: map[string]float64{"bg_late_share": 0}}, {Extra: map[string]float64{"bg_late_share": 0.5}}, {}}}
	if st := g.StatRecorded(BackgroundLate); st.N != 2 || st.Median != 25 || st.Min != 0 || st.Max != 50 {
		t.Errorf("StatRecorded = %+v, want 2 runs, median 25, 0..50", st)
	}
	// A metric every run records: every run.
	if st := g.StatRecorded(BackgroundKpps); st.N != 3 {
		t.Errorf("StatRecorded(BackgroundKpps) over %d runs, want 3", st.N)
	}
}
