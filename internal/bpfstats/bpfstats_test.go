package bpfstats

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Two copies of a program under one name, run through BPF_PROG_RUN with
// the statistics on: Take sums them under the name, Sub leaves what ran in
// between, and a name not asked for is not read.
func TestTakeSumsCopiesByName(t *testing.T) {
	c, err := Enable()
	if err != nil {
		t.Skip(err) // needs root and Linux >= 5.8
	}
	defer c.Close()
	const name = "lanes_stats_tst"
	var progs []*ebpf.Program
	for range 2 {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: name, Type: ebpf.XDP, License: "MIT",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}, // XDP_PASS
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		progs = append(progs, p)
	}
	run := func(p *ebpf.Program, n int) {
		t.Helper()
		for range n {
			if _, err := p.Run(&ebpf.RunOptions{Data: make([]byte, 64)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	names := map[string]bool{KernelName(name): true}
	run(progs[0], 3)
	before, err := Take(names)
	if err != nil {
		t.Fatal(err)
	}
	if got := before[name].Count; got != 3 {
		t.Errorf("before: %d runs, want 3", got)
	}
	run(progs[0], 5)
	run(progs[1], 7)
	after, err := Take(names)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	if got := d[name]; got.Count != 12 || got.Runtime <= 0 {
		t.Errorf("between: %+v, want 12 runs and some time", got)
	}
	if tot := d.Total(); tot != d[name] || len(d) != 1 {
		t.Errorf("total %+v of %v: want the one name's", tot, d)
	}
	if other, err := Take(map[string]bool{"lanes_not_this": true}); err != nil || len(other) != 0 {
		t.Errorf("a name not loaded: %v (%v), want nothing", other, err)
	}
}

func TestKernelName(t *testing.T) {
	for in, want := range map[string]string{
		"steer_xdp":                "steer_xdp",
		"steer_tc_split_seen":      "steer_tc_split_",
		"exactly_15_char":          "exactly_15_char",
		"drops_kthread_cpumap_end": "drops_kthread_c",
	} {
		if got := KernelName(in); got != want {
			t.Errorf("KernelName(%q) = %q, want %q", in, got, want)
		}
	}
}
