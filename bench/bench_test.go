package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/testbed"
)

func TestValidate(t *testing.T) {
	for _, o := range []Options{
		{Modes: []string{"falcon9"}, Out: "x"},
		{Modes: []string{"vanilla", "vanilla"}, Out: "x"},
		{Workloads: []string{"tcp_strem"}, Out: "x"},
		{Repeats: -1, Out: "x"},
		{Duration: time.Millisecond, Out: "x"},
		{Out: ""},
	} {
		err := o.Validate()
		if err == nil {
			t.Errorf("%+v: no error", o)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error is not one line: %q", err)
		}
	}
	o := Options{Out: "x", Quick: true}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	if o.Repeats != 3 || o.Duration != 2*time.Second || len(o.Modes) != 3 {
		t.Errorf("defaults: %+v", o)
	}
}

func TestPointsCoverPaperSizes(t *testing.T) {
	sizes := map[int]bool{}
	for _, p := range points([]string{"tcp_stream"}, false) {
		sizes[p.msgSize] = true
	}
	for _, s := range []int{16, 4096, 65536} {
		if !sizes[s] {
			t.Errorf("tcp_stream lacks %d B", s)
		}
	}
}

// A tiny real run: every mode measured, results.json complete, report and
// plots written, knobs restored and the testbed gone afterwards.
func TestRunEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	out := t.TempDir()
	prefix := "lbt"
	old := testbed.StateDir
	testbed.StateDir = t.TempDir()
	t.Cleanup(func() { testbed.Down(prefix); testbed.StateDir = old })
	o := Options{
		Modes:     []string{"native", "vanilla", "rps"},
		Workloads: []string{"tcp_stream", "udp_stress"},
		Quick:     true,
		Repeats:   1,
		Duration:  time.Second,
		Out:       out,
		Prefix:    prefix,
		IRQCPU:    -1,
	}
	f, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	// 3 stream sizes x 3 modes, udp_stress under the 2 overlay modes.
	if want := 3*3 + 2; len(f.Runs) != want {
		t.Fatalf("%d runs, want %d", len(f.Runs), want)
	}
	for _, r := range f.Runs {
		if r.Error != "" {
			t.Errorf("%s %s %dB: %s", r.Mode, r.Workload, r.MsgSize, r.Error)
		}
		if r.ThroughputGbps <= 0 || r.PPS <= 0 || len(r.CPU) == 0 {
			t.Errorf("%s %dB: empty measurement %+v", r.Mode, r.MsgSize, r)
		}
	}
	back, err := results.Read(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if back.Machine.Kernel == "" || len(back.Runs) != len(f.Runs) {
		t.Fatalf("results.json incomplete: %+v", back.Machine)
	}
	rep, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tcp_stream", "vs vanilla", "vs native", "rps"} {
		if !strings.Contains(string(rep), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	pngs, _ := filepath.Glob(filepath.Join(out, "*.png"))
	if len(pngs) == 0 {
		t.Error("no plots written")
	}
	if left := nsx.List(prefix + "-"); len(left) > 0 {
		t.Errorf("testbed left behind: %v", left)
	}
}
