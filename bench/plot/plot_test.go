package plot

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/bench/results/resultstest"
)

// outDir is LANES_PLOT_DIR when set (LANES_PLOT_DIR=/some/dir go test), to keep the figures
// for a look instead of writing them to a temp dir.
func outDir(t *testing.T) string {
	if d := os.Getenv("LANES_PLOT_DIR"); d != "" {
		return d
	}
	return t.TempDir()
}

func TestAll(t *testing.T) {
	names := drawAll(t, resultstest.File(), "")
	want := []string{
		"throughput_tcp_stream.png",
		"throughput_udp_stream.png",
		"flows_tcp_multi_131072B.png",
		"work_udp_stress_udp_64B.png",
		"cpu_tcp_stream_tcp_65536B.png",
		"cpu_udp_stream_udp_8972B.png",
		"cpu_tcp_multi_tcp_131072B_8flows.png",
		"cpu_pingpong_tcp_64B.png",
		"cpu_udp_stress_udp_64B.png",
		"cpu_memcached_tcp_100B_16flows.png",
		"cdf_pingpong_tcp_64B.png",
	}
	if !slices.Equal(names, want) {
		t.Errorf("files\n %v\nwant\n %v", names, want)
	}
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b := img.Bounds()
	if b.Dx() < 500 || b.Dy() < 300 {
		t.Errorf("%s: %dx%d", path, b.Dx(), b.Dy())
	}
	// Not blank: some pixels differ from the white background.
	var ink int
	for y := b.Min.Y; y < b.Max.Y; y += 4 {
		for x := b.Min.X; x < b.Max.X; x += 4 {
			if r, g, bl, _ := img.At(x, y).RGBA(); r != 0xffff || g != 0xffff || bl != 0xffff {
				ink++
			}
		}
	}
	if ink < 100 {
		t.Errorf("%s looks blank (%d inked samples)", path, ink)
	}
}

func TestSkipsWithoutData(t *testing.T) {
	dir := t.TempDir()
	// Empty file: nothing to draw, no error, no files.
	files, err := All(&results.File{}, dir)
	if err != nil || len(files) != 0 {
		t.Errorf("empty: %v %v", files, err)
	}
	// One message size, failed runs, no CPU data, no CDFs: every figure
	// is skipped cleanly.
	f := &results.File{Runs: []results.Run{
		{Mode: "vanilla", Workload: "tcp_stream", Proto: "tcp", MsgSize: 1400, Flows: 1, ThroughputGbps: 5},
		{Mode: "vanilla", Workload: "tcp_stream", Proto: "tcp", MsgSize: 64, Flows: 1, Error: "boom"},
		{Mode: "vanilla", Workload: "pingpong", Proto: "tcp", MsgSize: 64, Flows: 1, LatP50Us: 20},
		{Mode: "vanilla", Workload: "tcp_multi", Proto: "tcp", MsgSize: 1400, Flows: 4, ThroughputGbps: 5},
	}}
	files, err = All(f, dir)
	if err != nil || len(files) != 0 {
		t.Errorf("no-data file: %v %v", files, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("left %d files behind", len(ents))
	}
}

func TestHeaviestPoint(t *testing.T) {
	a := results.Aggregate([]results.Run{
		{Mode: "m", Workload: "w", MsgSize: 64, Flows: 8},
		{Mode: "m", Workload: "w", MsgSize: 1400, Flows: 2, Background: 0.5},
		{Mode: "m", Workload: "w", MsgSize: 1400, Flows: 4},
		{Mode: "m", Workload: "w", MsgSize: 1400, Flows: 1},
	}, nil)
	p, ok := HeaviestPoint(a, "w")
	if !ok || p.MsgSize != 1400 || p.Flows != 4 || p.Background != 0 {
		t.Errorf("heaviest %+v %v", p, ok)
	}
	if _, ok := HeaviestPoint(a, "none"); ok {
		t.Error("point for a workload without runs")
	}
	b := results.Aggregate([]results.Run{
		{Mode: "m", Workload: "w", MsgSize: 64},
		{Mode: "m", Workload: "w", MsgSize: 1400, Error: "failed"},
	}, nil)
	if p, _ := HeaviestPoint(b, "w"); p.MsgSize != 64 {
		t.Errorf("heaviest %+v: picked a point with only failed runs", p)
	}
}

func TestGuard(t *testing.T) {
	ok, err := guard(func() (bool, error) { panic("Values must be greater than 0 for a log scale.") })
	if ok || err == nil {
		t.Errorf("guard: %v %v", ok, err)
	}
}

// TestManyModes draws the figures with eight modes, as a full run with
// the later modes will: the CPU figure switches to compact labels.
func TestManyModes(t *testing.T) {
	f := resultstest.File()
	extra := []string{"falcon", "mflow", "prism-rr", "prism-hash", "prism-xdp"}
	var add []results.Run
	for i, m := range extra {
		for _, r := range f.Runs {
			if r.Mode == "rps" && r.Error == "" {
				r.Mode = m
				r.ThroughputGbps *= 1 + 0.1*float64(i+1)
				add = append(add, r)
			}
		}
	}
	f.Runs = append(f.Runs, add...)
	f.Modes = append(f.Modes, extra...)
	if files := drawAll(t, f, "many"); len(files) != 11 {
		t.Errorf("%d files", len(files))
	}
}

// The priority workloads' figures: PRISM's Fig. 9 (idle vs busy CDF), 11
// (latency vs load), the background's rate, memcached's request rate.
func TestPrioFigures(t *testing.T) {
	names := drawAll(t, resultstest.PrioFile(), "prio")
	for _, want := range []string{
		"cdf_prio_latency_idle_vs_busy.png",
		"latency_vs_background_prio_latency.png",
		"background_rate_prio_latency.png",
		"latency_vs_background_prio_memcached.png",
		"rate_vs_background_prio_memcached.png",
		"cdf_prio_latency_udp_64B_bg65.png",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s in %v", want, names)
		}
	}
	// memcached has one busy load: no line for the background's rate;
	// and no batch-size series in this run.
	for _, not := range []string{"background_rate_prio_memcached.png", "rate_vs_background_prio_latency.png"} {
		if slices.Contains(names, not) {
			t.Errorf("%s drawn", not)
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "order_vs_batch") {
			t.Errorf("%s drawn without batch variants", n)
		}
	}
}

// MFLOW's Fig. 7: one figure per stream point of a run with
// MODE:batch=N variants.
func TestBatchFigures(t *testing.T) {
	var order []string
	for _, n := range drawAll(t, resultstest.BatchFile(), "batch") {
		if strings.HasPrefix(n, "order_vs_batch") {
			order = append(order, n)
		}
	}
	want := []string{"order_vs_batch_udp_stress_udp_64B.png", "order_vs_batch_tcp_stream_tcp_65536B.png"}
	if !slices.Equal(order, want) {
		t.Errorf("batch figures %v, want %v", order, want)
	}
}

// drawAll draws every figure of f (into LANES_PLOT_DIR/sub when set),
// checks each is a PNG with ink, and returns their file names.
func drawAll(t *testing.T, f *results.File, sub string) []string {
	t.Helper()
	dir := outDir(t)
	if d := os.Getenv("LANES_PLOT_DIR"); d != "" {
		dir = filepath.Join(d, sub)
	}
	files, err := All(f, dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		checkPNG(t, f)
	}
	return names
}

// udp_stress paced at several rates (--rates): the capacity figure, and
// the CPU figure of the unpaced point, the one the modes loaded hardest.
func TestCapacityFigure(t *testing.T) {
	f := &results.File{}
	for _, mode := range []string{"vanilla", "falcon"} {
		for _, rate := range []int{0, 300000, 600000, 900000} {
			for rep := range 3 {
				got := float64(min(rate, 500000))
				if rate == 0 {
					got = 350000
				}
				if mode == "falcon" {
					got *= 1.2
				}
				f.Runs = append(f.Runs, results.Run{Mode: mode, Workload: "udp_stress", Proto: "udp", MsgSize: 64, Flows: 1,
					Rate: rate, Repeat: rep, PPS: got + float64(rep)*1000, SentPPS: float64(rate),
					CPU: []results.CPUUse{{CPU: 0, Idle: 10}, {CPU: 1, Idle: 5}}})
			}
		}
	}
	names := drawAll(t, f, "capacity")
	for _, want := range []string{"capacity_udp_stress.png", "cpu_udp_stress_udp_64B.png"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s in %v", want, names)
		}
	}
	if slices.Contains(drawAll(t, resultstest.File(), ""), "capacity_udp_stress.png") {
		t.Error("capacity figure drawn without paced points")
	}
}
