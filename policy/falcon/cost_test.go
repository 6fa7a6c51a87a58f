//go:build sweep

// TestSteerCost is an experiment, not a test: it runs the stress stream
// on the full path (no at-home fast path) with BPF run-time statistics on
// and prints what each steer program costs per packet.
//
//	go test -tags sweep -run TestSteerCost -v ./policy/falcon/
//	LANES_COST_SPLIT=false LANES_COST_SPREAD=1 go test -tags sweep ...
//
// LANES_COST_SPLIT=false leaves XDP off (split=auto on the testbed);
// LANES_COST_SPREAD=1 puts the bridge and container stages on cpu0, off the
// IRQ core, as the balancer does under load; LANES_COST_HOME=1 puts every
// stage on its at-home fast path (vanilla placement, no flow state), and
// LANES_COST_BARE=1 with it the bridge stage's bare path. The figures
// carry the statistics' own two clock reads per run. What to expect:
// spread, tc_ingress costs more than at vanilla placement, because the
// flow state's cache line moves between cores (the next stage's program
// on cpu0 counts the frames seen in the same entry tc_ingress writes on
// cpu1); at home tc_seen returns before parsing, so its figure there is
// about what the statistics' clock reads add to each program. For
// per-packet costs to cite, use `lanes bench --bpf-stats`, whose runs go
// into docs/status.md with their command.

package falcon_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/bench/stress"
	"github.com/lanesnet/lanes/bench/workload"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/testbed"
	"golang.org/x/sys/unix"
)

type progCost struct{ ns, cnt uint64 }

func readCosts(t *testing.T) map[string]progCost {
	out := map[string]progCost{}
	id := ebpf.ProgramID(0)
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			break
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, err := p.Info()
		ps, err2 := p.Stats()
		p.Close()
		if err != nil || err2 != nil || !strings.HasPrefix(info.Name, "steer_") {
			continue
		}
		rt, rc := ps.Runtime, ps.RunCount
		c := out[info.Name]
		c.ns += uint64(rt)
		c.cnt += rc
		out[info.Name] = c
	}
	return out
}

func TestSteerCost(t *testing.T) {
	st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb := modetest.UpTestbed(t, testbed.Docker)
	// LANES_COST_SPLIT=false leaves XDP off; LANES_COST_SPREAD=1 sends
	// the bridge and container stages to cpu0, away from the IRQ core.
	split := cmp.Or(os.Getenv("LANES_COST_SPLIT"), "true")
	a := modetest.Apply(t, tb, "falcon", map[string]string{"split": split})
	dp := a.Open(t)
	for _, stg := range []int{steer.StageSplit, steer.StageBridge, steer.StageContainer} {
		var tab [steer.Buckets]uint32
		for i := range tab {
			tab[i] = steer.Stay
			if os.Getenv("LANES_COST_SPREAD") != "" && stg != steer.StageSplit {
				tab[i] = 0
			}
		}
		if err := dp.Placement().SetTable(stg, tab); err != nil {
			t.Fatal(err)
		}
		// LANES_COST_HOME=1: every stage on its at-home fast path.
		if os.Getenv("LANES_COST_HOME") != "" {
			if err := dp.Placement().SetHome(stg, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	// LANES_COST_BARE=1 (with LANES_COST_HOME): the bridge stage's bare
	// path at home, no flow lookup.
	if os.Getenv("LANES_COST_BARE") != "" {
		if err := dp.Placement().SetHomeBare(); err != nil {
			t.Fatal(err)
		}
	}
	r, s := tb.Receiver(), tb.Sender()
	tgt := stress.Target{
		SenderNetNS: s.NetNS, SenderDev: s.Underlay, SrcMAC: s.UnderlayMAC, DstMAC: r.UnderlayMAC,
		SrcIP: s.UnderlayAddr.Addr(), DstIP: r.UnderlayAddr.Addr(), VNI: tb.Config.VNI,
		InnerSrcMAC: s.Containers[0].MAC, InnerDstMAC: r.Containers[0].MAC,
	}
	before := readCosts(t)
	w := stress.NewUDPStress(tgt, stress.GenConfig{CPU: 0, Yield: true})
	srv := workload.Endpoint{NetNS: r.Containers[0].NetNS, Addr: r.Containers[0].Addr.Addr(), CPUs: []int{1}}
	cli := workload.Endpoint{NetNS: s.Containers[0].NetNS, Addr: s.Containers[0].Addr.Addr()}
	res, err := w.Run(context.Background(), srv, cli, workload.Point{Duration: 3 * time.Second, Port: 31000})
	if err != nil {
		t.Fatal(err)
	}
	after := readCosts(t)
	var b strings.Builder
	fmt.Fprintf(&b, "\nrate %.0f Kpps\n", res.PPS/1e3)
	for n, c := range after {
		d := progCost{c.ns - before[n].ns, c.cnt - before[n].cnt}
		if d.cnt == 0 {
			continue
		}
		fmt.Fprintf(&b, "%-22s runs %10d  avg %6.0f ns  total %.2f s\n", n, d.cnt, float64(d.ns)/float64(d.cnt), float64(d.ns)/1e9)
	}
	t.Log(b.String())
}
