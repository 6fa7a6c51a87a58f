//go:build linux

package steer

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/internal/testenv"
)

// BenchmarkPlacedFrame is what a frame of a flow whose state exists costs
// each program that places it (BPF_PROG_RUN's own timing, per run, which
// the benchmark reports as bpf-ns/frame): the per-packet path every other
// frame takes. Root, the lock, and a quiet machine:
//
//	go test -run '^$' -bench PlacedFrame -count 5 ./datapath/steer/
func BenchmarkPlacedFrame(b *testing.B) {
	testenv.Root(b)
	d, err := Load()
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	cfg := Config{Enabled: true, CountSplit: true, CPUs: []int{0}, Flowlet: time.Millisecond, Drain: 20 * time.Millisecond, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	if err := d.SetConfig(cfg); err != nil {
		b.Fatal(err)
	}
	if err := d.CPUMap().Set(0, 64); err != nil {
		b.Fatal(err)
	}
	var tab [Buckets]uint32 // every bucket on core index 0
	for s := range NumStages {
		if err := d.Placement().SetTable(s, tab); err != nil {
			b.Fatal(err)
		}
	}
	f := udpFlow(40000)
	outer := vxlanFrame(frameSpec{flow: f, payload: 64})
	for _, p := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
	}{
		{"steer_xdp", d.XDP(), outer},
		{"steer_tc_ingress", d.TCIngress(), outer},
		{"steer_tc_egress", d.TCEgress(), outer[50:]},
	} {
		b.Run(p.name, func(b *testing.B) {
			if _, _, err := p.prog.Benchmark(p.frame, 1, nil); err != nil { // the flow's state
				b.Fatal(err)
			}
			var total time.Duration
			for b.Loop() {
				_, per, err := p.prog.Benchmark(p.frame, 100000, nil)
				if err != nil {
					b.Fatal(err)
				}
				total += per
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "bpf-ns/frame")
		})
	}
}
