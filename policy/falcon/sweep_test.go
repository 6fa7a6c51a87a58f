//go:build sweep

package falcon_test

// The placement sweep is an experiment, not a test: it measures single-flow
// UDP receive capacity (the benchmark's udp_stress: the live-frame
// generator yielding its core, a recvmmsg sink) under every static
// placement of the three steered stages and of the receiving application
// on a 2-core machine, to tell how much of Falcon's gain the mechanism can
// deliver here whatever the policy picks. Run it on a quiet machine:
//
//	go test -tags sweep -run TestPlacementSweep -v -timeout 30m ./policy/falcon/
//
// It asserts nothing about speed; it prints a table, medians over
// interleaved repeats, and each placement's ratio to vanilla placement.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/testbed"
)

func TestPlacementSweep(t *testing.T) {
	online := modetest.Online(t)
	if len(online) != 2 {
		t.Skipf("the sweep is written for 2 cores (this machine: %v)", online)
	}
	repeats := envInt(t, "SWEEP_REPEATS", 3)
	rate := envInt(t, "SWEEP_RATE", 0) // packets/s; 0: as fast as possible
	tb := modetest.UpTestbed(t, testbed.Docker)
	a := modetest.Apply(t, tb, "falcon", map[string]string{"split": "true"}) // split cpumap on core 0, no agent: tables stay as set here
	dp := a.Open(t)
	cfg, err := dp.Config()
	if err != nil {
		t.Fatal(err)
	}
	irq, other := 1, 0 // the testbed's IRQ core is the last one
	idx := func(cpu int) uint32 { return uint32(slices.Index(cfg.CPUs, cpu)) }
	set := func(stage int, v uint32) {
		var tab [steer.Buckets]uint32
		for i := range tab {
			tab[i] = v
		}
		if err := dp.Placement().SetTable(stage, tab); err != nil {
			t.Fatal(err)
		}
	}
	type placement struct{ split, bridge, container, app int }
	var all []placement
	for _, sp := range []int{irq, other} {
		for _, br := range []int{irq, other} {
			for _, ct := range []int{irq, other} {
				for _, app := range []int{irq, other} {
					all = append(all, placement{sp, br, ct, app})
				}
			}
		}
	}
	r, s := tb.Receiver(), tb.Sender()
	tgt := stress.Target{
		SenderNetNS: s.NetNS, SenderDev: s.Underlay, SrcMAC: s.UnderlayMAC, DstMAC: r.UnderlayMAC,
		SrcIP: s.UnderlayAddr.Addr(), DstIP: r.UnderlayAddr.Addr(), VNI: tb.Config.VNI,
		InnerSrcMAC: s.Containers[0].MAC, InnerDstMAC: r.Containers[0].MAC,
	}
	got := map[placement][]float64{}
	port := 31000
	for rep := range repeats {
		order := slices.Clone(all)
		// Rotate the order each repeat, as the benchmark does, so drift
		// does not favour the placements measured first.
		order = append(order[rep%len(order):], order[:rep%len(order)]...)
		for _, p := range order {
			if p.split == irq {
				set(steer.StageSplit, steer.Stay)
			} else {
				set(steer.StageSplit, idx(p.split))
			}
			set(steer.StageBridge, idx(p.bridge))
			set(steer.StageContainer, idx(p.container))
			port++ // a new flow each run: placed by the tables from its first packet
			w := stress.NewUDPStress(tgt, stress.GenConfig{CPU: other, Yield: true, Rate: float64(rate)})
			srv := workload.Endpoint{NetNS: r.Containers[0].NetNS, Addr: r.Containers[0].Addr.Addr(), CPUs: []int{p.app}}
			cli := workload.Endpoint{NetNS: s.Containers[0].NetNS, Addr: s.Containers[0].Addr.Addr()}
			res, err := w.Run(context.Background(), srv, cli, workload.Point{Duration: 2 * time.Second, Port: port})
			if err != nil {
				t.Fatalf("%+v: %v", p, err)
			}
			if res.UDPReorder != 0 {
				t.Errorf("%+v: %d datagrams out of order under a static placement", p, res.UDPReorder)
			}
			got[p] = append(got[p], res.PPS)
		}
	}
	vanilla := median(got[placement{irq, irq, irq, irq}])
	sort.Slice(all, func(i, j int) bool { return median(got[all[i]]) > median(got[all[j]]) })
	name := func(c int) string {
		if c == irq {
			return "irq"
		}
		return "other"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nsplit  bridge  container  app     Kpps median [min-max]  vs vanilla placement\n")
	for _, p := range all {
		v := got[p]
		fmt.Fprintf(&b, "%-6s %-7s %-10s %-7s %7.0f [%.0f-%.0f]  %.2f\n", name(p.split), name(p.bridge), name(p.container), name(p.app),
			median(v)/1e3, slices.Min(v)/1e3, slices.Max(v)/1e3, median(v)/vanilla)
	}
	t.Log(b.String())
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func envInt(t *testing.T, key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: want a number", key, v)
	}
	return n
}
