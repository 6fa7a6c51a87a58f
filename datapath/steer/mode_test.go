//go:build linux

package steer

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/internal/testenv"
)

// modeConfig is a config as a policy's planner writes it for one mode
// (policy/falcon, policy/mflow, policy/prism planner.go), on the tests'
// core 0.
type modeConfig struct {
	name string
	cfg  Config
	sync bool // with PRISM-sync's set (testSyncSet)
}

func modeConfigs() []modeConfig {
	base := Config{Enabled: true, CPUs: []int{0}, Flowlet: DefaultFlowlet, Drain: DefaultDrain, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	with := func(f func(*Config)) Config {
		c := base
		f(&c)
		return c
	}
	prism := func(c *Config) { c.Prio, c.CountSplit = true, true }
	// PRISM's defaults where the NIC is polled on the receive core alone:
	// bulk inline while idle, high=auto, bulk quiet, bulk=auto.
	auto := func(c *Config) {
		prism(c)
		c.PrioIdleInline, c.HighAutoPPS, c.BulkQuiet, c.BulkAuto = true, 5000, 20*time.Millisecond, 100*time.Millisecond
	}
	return []modeConfig{
		{name: "placement", cfg: base},
		{name: "falcon", cfg: with(func(c *Config) { c.CountSplit = true })},
		{name: "falcon-stay-queued", cfg: with(func(c *Config) { c.CountSplit, c.StayQueued = true, true })},
		{name: "falcon-prism", cfg: with(prism)},
		{name: "mflow-irq", cfg: with(func(c *Config) {
			c.MFlow = MFlow{At: SplitAtIRQ, Batch: 4, Cores: []int{0}, Window: time.Millisecond}
		})},
		{name: "mflow-bridge", cfg: with(func(c *Config) {
			c.NoBridgeCount = true
			c.MFlow = MFlow{At: SplitAtBridge, Batch: 4, Cores: []int{0}, Window: time.Millisecond}
		})},
		{name: "prism-batch-queue", cfg: with(prism)},
		{name: "prism-batch", cfg: with(auto)},
		{name: "prism-sync", cfg: with(func(c *Config) { auto(c); c.Sync = true }), sync: true},
		{name: "prism-veth-class", cfg: with(func(c *Config) { prism(c); c.VethClass = true })},
		{name: "fast", cfg: with(func(c *Config) { c.Fast, c.FastIdle = true, DefaultFastIdle })},
	}
}

// progSizes is each program's size as the kernel verified it: the
// translated (xlated) instructions, what the verifier left of the object
// for this mode, and the JIT's bytes.
func progSizes(t *testing.T, d *Datapath) map[string][2]uint32 {
	t.Helper()
	out := map[string][2]uint32{}
	for name, p := range map[string]*ebpf.Program{
		"steer_xdp": d.objs.SteerXdp, "steer_tc_ingress": d.objs.SteerTcIngress, "steer_tc_egress": d.objs.SteerTcEgress,
		"steer_tc_seen": d.objs.SteerTcSeen, "steer_tc_split_seen": d.objs.SteerTcSplitSeen,
		"steer_tc_veth_class": d.objs.SteerTcVethClass, "steer_tc_veth_seen": d.objs.SteerTcVethSeen,
		"steer_drops_ring": d.objs.SteerDropsRing, "steer_drops_kthread": d.objs.SteerDropsKthread,
		"steer_drops_skb": d.objs.SteerDropsSkb, "steer_sync_xmit": d.objs.SteerSyncXmit,
		"steer_sync_redirect_err": d.objs.SteerSyncRedirectErr, "steer_notify": d.objs.SteerNotify,
		"steer_tc_fast": d.objs.SteerTcFast, "steer_tc_fast_learn": d.objs.SteerTcFastLearn,
	} {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		x, err := info.TranslatedSize()
		if err != nil {
			t.Skipf("the kernel reports no translated size: %v", err)
		}
		j, _ := info.JitedSize()
		out[name] = [2]uint32{uint32(x / 8), j}
	}
	return out
}

// TestModeObjects loads the object specialized for each mode as an apply
// does (LoadFor) and runs every frame of the package's tests (the
// fuzzers' seed corpus) through steer_xdp and the tc programs, checked as
// the fuzzers check them. It logs each program's verified size per mode
// (go test -v); LANES_MODE_SIZES=file writes them there as a table.
func TestModeObjects(t *testing.T) {
	testenv.Root(t)
	frames := seedFrames()
	sizes := map[string]map[string][2]uint32{}
	var names []string
	for _, m := range modeConfigs() {
		t.Run(m.name, func(t *testing.T) {
			d, err := fuzzDatapath(Setup{Config: m.cfg, CPUMap: []int{0}, HiCPUMap: []int{0}})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if err := fuzzTables(d, 1, 1); err != nil { // every bucket on core index 0
				t.Fatal(err)
			}
			if d.mode != modeOf(mustNormalized(t, m.cfg)) {
				t.Fatalf("loaded for %s, want %s", modeString(d.mode), modeString(modeOf(m.cfg)))
			}
			if m.sync {
				if err := d.Sync().Set(testSyncSet(1500), 24*time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			runs := []tcRun{
				{name: "steer_tc_ingress", prog: d.TCIngress(), d: d, stage: StageBridge, outer: true},
				{name: "steer_tc_egress", prog: d.TCEgress(), d: d, stage: StageContainer, inner: true},
				{name: "steer_tc_seen", prog: d.TCSeen(), d: d},
				{name: "steer_tc_split_seen", prog: d.TCSplitSeen(), d: d},
			}
			if m.cfg.VethClass {
				runs = append(runs,
					tcRun{name: "steer_tc_veth_class", prog: d.TCVethClass(), d: d, stage: StageContainer, inner: true, veth: true},
					tcRun{name: "steer_tc_veth_seen", prog: d.TCVethSeen(), d: d})
			}
			n := 0
			for _, f := range frames {
				if len(f) < ethHeaderLen || len(f) > 3000 {
					continue
				}
				checkXDP(t, d, fuzzState{}, f)
				for _, r := range runs {
					checkTC(t, r, fuzzState{}, f)
				}
				n++
			}
			st := stats(t, d)
			t.Logf("%d frames: split %+v", n, st[StageSplit])
			// Each mode did what it is for, not only passed frames on.
			switch {
			case m.sync && st[StageSplit].Sync == 0:
				t.Error("no frame took PRISM-sync's shortcut")
			case m.cfg.Prio && st[StageSplit].High == 0:
				t.Error("no frame classified high")
			case m.cfg.MFlow.At == SplitAtIRQ && st[StageSplit].MicroFrames == 0,
				m.cfg.MFlow.At == SplitAtBridge && st[StageBridge].MicroFrames == 0:
				t.Error("no frame split into a micro-flow")
			case !m.cfg.Prio && m.cfg.MFlow.At != SplitAtIRQ && st[StageSplit].Steered == 0:
				t.Error("no frame steered to its core's queue")
			}
			sizes[m.name] = progSizes(t, d)
			names = append(names, m.name)
		})
	}
	// The verifier drops what a mode leaves out: placement alone is the
	// smallest steer_xdp, PRISM-sync's shortcut and classification the
	// largest.
	if p, s := sizes["placement"], sizes["prism-sync"]; p != nil && s != nil && p["steer_xdp"][0] >= s["steer_xdp"][0] {
		t.Errorf("steer_xdp for placement alone has %d instructions, for prism-sync %d: specialization dropped nothing", p["steer_xdp"][0], s["steer_xdp"][0])
	}
	table := sizeTable(names, sizes)
	t.Log("\n" + table)
	if f := os.Getenv("LANES_MODE_SIZES"); f != "" {
		if err := os.WriteFile(f, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func mustNormalized(t *testing.T, c Config) Config {
	t.Helper()
	c, err := c.normalized()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sizeTable is sizes as rows of programs, columns of modes: xlated
// instructions/jited bytes.
func sizeTable(modes []string, sizes map[string]map[string][2]uint32) string {
	progs := []string{"steer_xdp", "steer_tc_ingress", "steer_tc_egress", "steer_tc_seen", "steer_tc_split_seen",
		"steer_tc_veth_class", "steer_tc_veth_seen", "steer_drops_ring", "steer_drops_kthread", "steer_drops_skb",
		"steer_sync_xmit", "steer_sync_redirect_err", "steer_notify", "steer_tc_fast", "steer_tc_fast_learn"}
	var b strings.Builder
	fmt.Fprintf(&b, "%-24s", "program")
	for _, m := range modes {
		fmt.Fprintf(&b, " %18s", m)
	}
	b.WriteString("\n")
	for _, p := range progs {
		fmt.Fprintf(&b, "%-24s", p)
		for _, m := range modes {
			s := sizes[m][p]
			fmt.Fprintf(&b, " %18s", fmt.Sprintf("%d/%d", s[0], s[1]))
		}
		b.WriteString("\n")
	}
	return b.String()
}
