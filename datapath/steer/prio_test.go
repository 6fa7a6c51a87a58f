//go:build linux

package steer

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

func TestParseRule(t *testing.T) {
	for in, want := range map[string]Rule{
		"198.18.0.2":                  {Addr: netip.MustParseAddr("198.18.0.2")},
		"dst 198.18.0.2 port 80 tcp":  {Addr: netip.MustParseAddr("198.18.0.2"), Port: 80, Proto: 6},
		"src 10.0.0.1 udp":            {Src: true, Addr: netip.MustParseAddr("10.0.0.1"), Proto: 17},
		"  dst 10.0.0.1   port 11111": {Addr: netip.MustParseAddr("10.0.0.1"), Port: 11111},
	} {
		got, err := ParseRule(in)
		if err != nil || got != want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", in, got, err, want)
			continue
		}
		if again, err := ParseRule(got.String()); err != nil || again != got {
			t.Errorf("%q -> %q does not read back: %+v %v", in, got.String(), again, err)
		}
	}
	for _, in := range []string{"", "dst", "::1", "198.18.0.2 port", "198.18.0.2 port 0", "198.18.0.2 port 70000", "198.18.0.2 icmp", "host 1.2.3.4"} {
		if _, err := ParseRule(in); err == nil || !strings.Contains(err.Error(), "want [dst|src]") {
			t.Errorf("ParseRule(%q): error %v, want one saying the syntax", in, err)
		}
	}
}

// prioDatapath: priority classes on, every split bucket at core index 0,
// a normal queue on core 0 and, if hiQueue, a high-priority one.
func prioDatapath(t *testing.T, hiQueue bool, drain time.Duration) *Datapath {
	t.Helper()
	d, _ := newDatapath(t)
	cfg := Config{Enabled: true, Prio: true, CountSplit: true, CPUs: []int{0}, Drain: drain, VXLANPort: testPort, VNIs: []uint32{testVNI}}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); !got.Prio {
		t.Fatalf("config %+v does not read back Prio", got)
	}
	if hiQueue {
		if err := d.HiCPUMap().Set(0, 64); err != nil {
			t.Fatal(err)
		}
	}
	setAll(t, d, StageSplit, 0)
	return d
}

func addRule(t *testing.T, d *Datapath, s string) Rule {
	t.Helper()
	r, err := ParseRule(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Prio().AddRule(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestPrioClassifies: a flow a rule matches goes to the core's
// high-priority queue, others to the normal one. Which queue shows in the
// verdict: without a high-priority entry the redirect falls back to
// XDP_PASS, while the normal entry exists.
func TestPrioClassifies(t *testing.T) {
	d := prioDatapath(t, false, 0)
	hiTCP := tcpFlow(40000)
	hiTCP.dport = 11111
	addRule(t, d, "dst "+innerDst.String()+" port 11111 tcp")
	addRule(t, d, "src "+innerSrc.String()+" port 5000")
	addRule(t, d, "dst 10.9.9.9")
	srcRule := udpFlow(5000)
	anyPort := udpFlow(40001)
	anyPort.dst = netip.MustParseAddr("10.9.9.9")
	wrongProto := udpFlow(40002)
	wrongProto.dport = 11111

	for _, c := range []struct {
		name string
		f    flowSpec
		high bool
	}{
		{"dst address, port and protocol", hiTCP, true},
		{"src address and port, any protocol", srcRule, true},
		{"dst address alone", anyPort, true},
		{"right port, wrong protocol", wrongProto, false},
		{"no rule", tcpFlow(40003), false},
	} {
		frame := vxlanFrame(frameSpec{flow: c.f})
		ret, out := runXDP(t, d, frame)
		sameBytes(t, c.name, frame, out)
		want := uint32(xdpRedirect)
		if c.high {
			want = xdpPass // no high-priority queue on the core
		}
		if ret != want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, want)
		}
		if fl := mustFlow(t, d, c.f, StageSplit); fl.High != c.high || fl.CPUIndex != 0 {
			t.Errorf("%s: flow %+v, want high=%v on index 0", c.name, fl, c.high)
		}
	}
	if st := stats(t, d)[StageSplit]; st.High != 3 || st.Steered != 2 || st.Stayed != 3 {
		t.Errorf("counters %+v, want 3 high (stayed: no queue), 2 steered", st)
	}

	// With the queue, high-priority frames are redirected too.
	if err := d.HiCPUMap().Set(0, 64); err != nil {
		t.Fatal(err)
	}
	if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: hiTCP})); ret != xdpRedirect {
		t.Errorf("with a high-priority queue: verdict %d, want XDP_REDIRECT", ret)
	}
	if cm, err := d.HiCPUMap().Entries(); err != nil || !slices.Equal(cm, []int{0}) {
		t.Errorf("high-priority entries %v %v, want [0]", cm, err)
	}

	// Prio off: rules are kept but not consulted.
	cfg, _ := d.Config()
	cfg.Prio = false
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	f := tcpFlow(40004)
	f.dst = netip.MustParseAddr("10.9.9.9")
	runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
	if fl := mustFlow(t, d, f, StageSplit); fl.High {
		t.Errorf("classified with Prio off: %+v", fl)
	}
}

func TestPrioRulesAPI(t *testing.T) {
	d := prioDatapath(t, true, 0)
	b := addRule(t, d, "src 10.0.0.1 udp")
	a := addRule(t, d, "dst 10.0.0.2 port 80 tcp")
	addRule(t, d, "dst 10.0.0.2 port 80 tcp") // again: no error
	rules, err := d.Prio().Rules()
	if err != nil || !slices.Equal(rules, []Rule{a, b}) {
		t.Fatalf("rules %v %v, want [%v %v]", rules, err, a, b)
	}
	if err := d.Prio().DelRule(a); err != nil {
		t.Fatal(err)
	}
	if err := d.Prio().DelRule(a); err == nil || !strings.Contains(err.Error(), "no priority rule") {
		t.Errorf("deleting a missing rule: %v", err)
	}
	if err := d.Prio().AddRule(Rule{Addr: netip.MustParseAddr("::1")}); err == nil {
		t.Error("an IPv6 rule was accepted")
	}
	if rules, _ := d.Prio().Rules(); !slices.Equal(rules, []Rule{b}) {
		t.Errorf("after delete: %v", rules)
	}
}

// TestPrioClassChangeWaitsForDrain: a rule added while a flow has frames in
// its normal queue takes effect once they were seen, like any move.
func TestPrioClassChangeWaitsForDrain(t *testing.T) {
	d := prioDatapath(t, true, time.Hour)
	f := udpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.High || fl.InFlight != 1 {
		t.Fatalf("flow %+v, want normal class with 1 frame in flight", fl)
	}
	addRule(t, d, "dst "+innerDst.String())
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); fl.High {
		t.Errorf("changed class with frames queued: %+v", fl)
	}
	if st := stats(t, d)[StageSplit]; st.Held != 1 {
		t.Errorf("counters %+v, want 1 held", st)
	}
	cfg, _ := d.Config()
	cfg.Drain = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	runXDP(t, d, frame)
	if fl := mustFlow(t, d, f, StageSplit); !fl.High {
		t.Errorf("did not change class once allowed: %+v", fl)
	}
}

// TestPrioMalformedPassUntouched: with a rule matching every inner flow of
// the test frames, what the parser does not understand still passes
// untouched and is not classified.
func TestPrioMalformedPassUntouched(t *testing.T) {
	d := prioDatapath(t, true, 0)
	addRule(t, d, "dst "+innerDst.String())
	frames := outerMalformed()
	for name, frame := range frames {
		ret, out := runXDP(t, d, frame)
		if ret != xdpPass {
			t.Errorf("%s: verdict %d, want XDP_PASS", name, ret)
		}
		sameBytes(t, name, frame, out)
	}
	if st := stats(t, d)[StageSplit]; st.High != 0 || st.Passed != uint64(len(frames)) {
		t.Errorf("counters %+v, want %d passed, none high", st, len(frames))
	}
}

// TestPrioShapes: the programs look up only rule shapes that exist; the
// mask follows adds and deletes and survives a config rewrite.
func TestPrioShapes(t *testing.T) {
	d := prioDatapath(t, true, 0)
	shapes := func() uint32 {
		t.Helper()
		m, err := d.Prio().Shapes()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := shapes(); m != 0 {
		t.Fatalf("shapes %#x with no rule", m)
	}
	a := addRule(t, d, "dst "+innerDst.String()+" port 80 tcp") // dst, port + proto: bit 0
	b := addRule(t, d, "src 10.9.9.9 udp")                      // src, proto only: bit 4+2
	if m := shapes(); m != 1|1<<6 {
		t.Errorf("shapes %#x, want %#x", m, 1|1<<6)
	}
	cfg, _ := d.Config()
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if m := shapes(); m != 1|1<<6 {
		t.Errorf("after SetConfig: shapes %#x, want %#x", m, 1|1<<6)
	}
	f := tcpFlow(40000)
	f.dport = 80
	runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
	if fl := mustFlow(t, d, f, StageSplit); !fl.High {
		t.Errorf("not classified after SetConfig: %+v", fl)
	}
	if err := d.Prio().DelRule(a); err != nil {
		t.Fatal(err)
	}
	if err := d.Prio().DelRule(b); err != nil {
		t.Fatal(err)
	}
	if m := shapes(); m != 0 {
		t.Errorf("shapes %#x after deleting every rule", m)
	}
}

// TestPrioRuleWritersRace: two writers of one pinned datapath's rules
// (lanes prio and lanes agent are two processes, each with its own
// handle) add rules of different shapes at once, round after round: after
// each round the shape mask holds both rules' shapes, so the programs
// look up every rule reported added. Unpin takes the rules' lock along.
func TestPrioRuleWritersRace(t *testing.T) {
	d := prioDatapath(t, false, 0)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unpin(dir) })
	var writers [2]*Datapath
	for i := range writers {
		w, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		writers[i] = w
	}
	rules := [2]Rule{
		{Addr: innerDst, Port: 80, Proto: ipProtoTCP},  // dst, port and protocol
		{Src: true, Addr: innerSrc, Proto: ipProtoUDP}, // src, protocol only
	}
	const rounds = 3000
	lost := 0
	for range rounds {
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, w := range writers {
			wg.Go(func() {
				<-start
				errs[i] = w.Prio().AddRule(rules[i])
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if m, err := d.Prio().Shapes(); err != nil {
			t.Fatal(err)
		} else if m != rules[0].shape()|rules[1].shape() {
			lost++
		}
		for _, r := range rules {
			if err := d.Prio().DelRule(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d rounds left a rule reported added out of the shape mask", lost, rounds)
	}
	if err := Unpin(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory left after Unpin: %v", err)
	}
}

// PrioIdleInline: with no rule a bulk frame stays in the NIC poll (vanilla's
// path); once a rule exists a new flow takes the bulk queue, and the config
// refuses the setting where its fast moves would not be order-safe.
func TestPrioIdleInline(t *testing.T) {
	d := prioDatapath(t, true, time.Hour)
	cfg, _ := d.Config()
	cfg.PrioIdleInline = true
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); !got.PrioIdleInline {
		t.Fatalf("config %+v does not read back PrioIdleInline", got)
	}
	f := udpFlow(40000)
	frame := vxlanFrame(frameSpec{flow: f})
	ret, out := runXDP(t, d, frame)
	sameBytes(t, "bulk frame with no rule", frame, out)
	if ret != xdpPass {
		t.Errorf("bulk frame with no rule: verdict %d, want XDP_PASS", ret)
	}
	if fl := mustFlow(t, d, f, StageSplit); fl.CPUIndex != Stay || fl.High {
		t.Errorf("flow %+v with no rule: want it in the NIC poll (Stay)", fl)
	}
	addRule(t, d, "dst 10.9.9.9")
	g := udpFlow(40001)
	if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: g})); ret != xdpRedirect {
		t.Errorf("new bulk flow with a rule: verdict %d, want XDP_REDIRECT (the bulk queue)", ret)
	}
	if fl := mustFlow(t, d, g, StageSplit); fl.CPUIndex != 0 {
		t.Errorf("new bulk flow with a rule: %+v, want the queue of index 0", fl)
	}

	for name, edit := range map[string]func(*Config){
		"without priority classes": func(c *Config) { c.Prio = false },
		"without split counting":   func(c *Config) { c.CountSplit = false },
		"on a core not steered to": func(c *Config) { c.CPUs, c.InlineCPU = []int{0, 1}, 5 },
	} {
		c := cfg
		c.CPUs = slices.Clone(cfg.CPUs)
		edit(&c)
		if err := d.SetConfig(c); err == nil {
			t.Errorf("PrioIdleInline %s accepted", name)
		}
	}
}

// falcon-prism's bulk placement: with two cores and the NIC polled on
// core 1 (InlineCPU), a bulk flow whose first stage the table puts in
// core 1's queue runs in the NIC poll while no rule exists; one the table
// puts on core 0 (Falcon spread it) takes core 0's queue. A flow moves
// between the NIC poll and core 1's queue at once (the fast move: one
// core), but between either and core 0's queue only after an idle gap:
// frames left on the other core could otherwise be overtaken.
func TestPrioIdleInlineTwoCores(t *testing.T) {
	d, cores := newDatapath(t)
	if len(cores) < 2 {
		t.Skip("needs two cores")
	}
	defer pinThread(t, 1)() // PLACE_LOCAL: BPF_PROG_RUN on InlineCPU
	cfg := Config{Enabled: true, Prio: true, CountSplit: true, CPUs: []int{0, 1}, Flowlet: time.Hour, Drain: time.Hour,
		VXLANPort: testPort, VNIs: []uint32{testVNI}, PrioIdleInline: true, InlineCPU: 1}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); !got.PrioIdleInline || got.InlineCPU != 1 || len(got.CPUs) != 2 {
		t.Fatalf("config %+v does not read back PrioIdleInline on core 1 of two", got)
	}
	if v, s := knobRoundTrip(t, cfg); s.Config.InlineCPU != 1 || !s.Config.PrioIdleInline {
		t.Errorf("knob value %s decodes to %+v", v, s.Config)
	}
	const home, away = 1, 0 // table indices: cores 1 and 0
	step := func(name string, f flowSpec, verdict uint32, marked bool, idx uint32) {
		t.Helper()
		ret, _, meta := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: f}))
		fl := mustFlow(t, d, f, StageSplit)
		if ret != verdict || (meta != nil) != marked || fl.CPUIndex != idx {
			t.Errorf("%s: verdict %d, marked %v, flow at %d; want %d, %v, %d", name, ret, meta != nil, fl.CPUIndex, verdict, marked, idx)
		}
	}
	inline, spread := udpFlow(40000), udpFlow(40001)
	setAll(t, d, StageSplit, home)
	step("bulk at home, no rule: the NIC poll", inline, xdpPass, false, Stay)
	setAll(t, d, StageSplit, away)
	step("bulk spread to core 0, no rule: core 0's queue", spread, xdpRedirect, true, away)
	// The NIC poll's flow, table at core 0: it waits for the idle gap
	// (an hour), unmarked (no fast move to ready).
	step("NIC poll, table at core 0: waits", inline, xdpPass, false, Stay)
	step("NIC poll, table at core 0: still waits", inline, xdpPass, false, Stay)
	// Core 0's flow, table home, no rule: the NIC poll is on core 1, so
	// the move waits for the idle gap too.
	setAll(t, d, StageSplit, home)
	drainFlows(t, d)
	step("core 0's queue, table home: waits", spread, xdpRedirect, true, away)
	// With a rule, the NIC poll's flow is marked, counted and seen, then
	// takes core 1's queue at once.
	addRule(t, d, "dst 10.9.9.9")
	step("NIC poll, rule: marked, counted", inline, xdpPass, true, Stay)
	drainFlows(t, d)
	step("NIC poll, rule, none in flight: core 1's queue", inline, xdpRedirect, true, home)
}

// With PrioQuiet, bulk flows keep the NIC poll while rules exist but no
// high-priority frame came for that long (none at all yet counts as
// quiet), and take the bulk queue from the first high-priority frame on.
// New flows are placed at once, so each check uses a fresh one.
func TestPrioQuiet(t *testing.T) {
	d := prioDatapath(t, true, time.Hour)
	cfg, _ := d.Config()
	cfg.PrioIdleInline, cfg.PrioQuiet = true, 50*time.Millisecond
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); got.PrioQuiet != 50*time.Millisecond {
		t.Fatalf("config %+v does not read back PrioQuiet", got)
	}
	hi := flowSpec{src: innerSrc, dst: innerDst, sport: 5000, dport: 7777, proto: protoUDP}
	addRule(t, d, "dst "+innerDst.String()+" port 7777 udp")
	bulk := func(name string, sport uint16, want uint32) {
		t.Helper()
		f := udpFlow(sport)
		if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: f})); ret != want {
			t.Errorf("%s: verdict %d, want %d", name, ret, want)
		}
		fl := mustFlow(t, d, f, StageSplit)
		if inline := fl.CPUIndex == Stay; inline != (want == xdpPass) {
			t.Errorf("%s: flow %+v, NIC poll %v", name, fl, inline)
		}
	}
	if _, ok, err := d.Prio().SinceHigh(); ok || err != nil {
		t.Fatalf("a high-priority frame's time before any (%v)", err)
	}
	bulk("rule, no high-priority frame yet", 40000, xdpPass)
	if ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: hi})); ret != xdpRedirect {
		t.Fatalf("high-priority frame: verdict %d, want XDP_REDIRECT", ret)
	}
	if since, ok, err := d.Prio().SinceHigh(); !ok || err != nil || since > time.Second {
		t.Errorf("last high-priority frame %v ago (stamped %v, %v), want just now", since, ok, err)
	}
	bulk("right after a high-priority frame", 40001, xdpRedirect)
	// The stamp is the coarse clock's, up to a tick behind; two ticks at
	// HZ=100 are 20 ms.
	time.Sleep(50*time.Millisecond + 30*time.Millisecond)
	bulk("quiet again", 40002, xdpPass)

	for name, edit := range map[string]func(*Config){
		"without PrioIdleInline": func(c *Config) { c.PrioIdleInline = false },
		"under a millisecond":    func(c *Config) { c.PrioQuiet = 500 * time.Microsecond },
		"in parts of one":        func(c *Config) { c.PrioQuiet = 1500 * time.Microsecond },
		"over an hour":           func(c *Config) { c.PrioQuiet = 2 * time.Hour },
	} {
		c := cfg
		edit(&c)
		if err := d.SetConfig(c); err == nil {
			t.Errorf("PrioQuiet %s accepted", name)
		}
	}
}

// drainFlows sets every flow state's in-flight count to 0, as the tc side
// does once it has seen every counted frame.
func drainFlows(t *testing.T, d *Datapath) {
	t.Helper()
	var (
		k  steerSteerFlowKey
		st steerSteerFlowState
	)
	it := d.objs.SteerFlows.Iterate()
	for it.Next(&k, &st) {
		st.Inflight = 0
		if err := d.objs.SteerFlows.Put(&k, &st); err != nil {
			t.Fatal(err)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
}

// With PrioIdleInline on the core the program runs on, a TCP flow in the
// NIC poll that must move to the bulk queue (a rule appeared) has its
// frames marked and counted only from the segment after one that ended a
// GRO segment (PSH), never in the middle of one, and moves, without an
// idle gap, once a marked frame was counted and none is in flight.
func TestPrioIdleInlineMarksAtSegmentEnds(t *testing.T) {
	// BPF_PROG_RUN runs the program on the calling thread's core, which
	// must be the config's one core (0) for PLACE_LOCAL. The thread's
	// affinity is put back before it returns to the Go scheduler.
	defer pinThread(t, 0)()
	d := prioDatapath(t, true, time.Hour)
	cfg, _ := d.Config()
	cfg.PrioIdleInline = true
	cfg.Flowlet = time.Hour // no idle-gap move: only the fast one
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	f := tcpFlow(40000)
	step := func(name string, psh bool, verdict uint32, marked bool, inflight int64) {
		t.Helper()
		ret, _, meta := runXDPMeta(t, d, tcpSegment(f, psh))
		fl := mustFlow(t, d, f, StageSplit)
		if ret != verdict || (meta != nil) != marked || fl.InFlight != inflight {
			t.Errorf("%s: verdict %d marked %v in flight %d, want %d %v %d", name, ret, meta != nil, fl.InFlight, verdict, marked, inflight)
		}
	}
	step("no rule", false, xdpPass, false, 0)
	rule := addRule(t, d, "dst 10.9.9.9")
	step("rule, mid-segment", false, xdpPass, false, 0)
	step("rule, segment end (PSH)", true, xdpPass, false, 0)
	step("first frame of a segment: marked", false, xdpPass, true, 1)
	step("marked, one in flight", false, xdpPass, true, 2)
	drainFlows(t, d)
	step("none in flight: in the queue", false, xdpRedirect, true, 1)
	if st := stats(t, d)[StageSplit]; st.Moved != 1 {
		t.Errorf("counters %+v, want 1 move", st)
	}
	// The rule goes: back to the NIC poll once the queue holds none of
	// the flow, still marked until the next segment end (the queue's
	// frames reach the shared GRO cell with metadata), then unmarked.
	if err := d.Prio().DelRule(rule); err != nil {
		t.Fatal(err)
	}
	step("rule gone, one in flight: stays in the queue", false, xdpRedirect, true, 2)
	drainFlows(t, d)
	step("back in the NIC poll, marked", false, xdpPass, true, 1)
	step("marked up to the segment end (PSH)", true, xdpPass, true, 2)
	step("after the segment end: unmarked", false, xdpPass, false, 2)
	if st := stats(t, d)[StageSplit]; st.Moved != 2 {
		t.Errorf("counters %+v, want 2 moves", st)
	}
}

// PRISM's high=auto (SetHighInline): with a rule's switch on, the flows
// it marks run their first stage in the NIC poll; a flow already in the
// high-priority queue moves there only once none of its frames is in
// flight, and back into the queue only once a frame it left in the NIC
// poll was marked and counted and none is in flight: the switch never
// lets a frame overtake the flow's earlier ones. A new flow starts where
// its rule's switch says; another rule's flows keep their queue. Each
// rule's frames are counted (HighRuleFrames). The switches are runtime
// state (SetConfig puts every rule's flows back in their queue, DelRule
// drops the rule's), heeded only under high=auto (HighAutoPPS), which
// needs PrioIdleInline, whose fast moves they use.
func TestPrioHighInline(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	rule := addRule(t, d, "dst "+innerDst.String()+" port 7777 udp")
	if err := d.Prio().SetHighInline(rule, switchUntil(true)); err == nil {
		t.Error("SetHighInline without high=auto accepted")
	}
	cfg, _ := d.Config()
	cfg.HighAutoPPS = 5000
	if err := d.SetConfig(cfg); err == nil {
		t.Error("high=auto without PrioIdleInline accepted")
	}
	cfg.PrioIdleInline = true
	cfg.Flowlet = time.Hour // no idle-gap move: only the fast one
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); got.HighAutoPPS != 5000 {
		t.Fatalf("config %+v does not read back HighAutoPPS", got)
	}
	light := addRule(t, d, "dst "+innerDst.String()+" port 8888 udp")
	hi := flowSpec{src: innerSrc, dst: innerDst, sport: 5000, dport: 7777, proto: protoUDP}
	step := func(name string, f flowSpec, verdict uint32, marked bool, inflight int64, cpu uint32) {
		t.Helper()
		ret, _, meta := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: f}))
		fl := mustFlow(t, d, f, StageSplit)
		if ret != verdict || (meta != nil) != marked || fl.InFlight != inflight || fl.CPUIndex != cpu || fl.High != (cpu != Stay) {
			t.Errorf("%s: verdict %d marked %v in flight %d on %d (%+v), want %d %v %d on %d", name, ret, meta != nil, fl.InFlight, fl.CPUIndex, fl, verdict, marked, inflight, cpu)
		}
	}
	step("queue: in the high-priority queue", hi, xdpRedirect, true, 1, 0)
	if on, err := d.Prio().HighInline(); len(on) != 0 || err != nil {
		t.Fatalf("HighInline %v (%v) before the switch", on, err)
	}
	if err := d.Prio().SetHighInline(rule, switchUntil(true)); err != nil {
		t.Fatal(err)
	}
	if on, err := d.Prio().HighInline(); !slices.Equal(on, []Rule{rule}) || err != nil {
		t.Fatalf("HighInline %v (%v) after the switch, want [%s]", on, err, rule)
	}
	step("inline, one in flight: stays in the queue", hi, xdpRedirect, true, 2, 0)
	drainFlows(t, d)
	step("inline, none in flight: in the NIC poll, marked", hi, xdpPass, true, 1, Stay)
	other := hi
	other.sport = 5001
	step("inline: a new flow starts in the NIC poll", other, xdpPass, false, 0, Stay)
	lightFlow := hi
	lightFlow.dport = 8888
	step("another rule's flow, its switch off: in the queue", lightFlow, xdpRedirect, true, 1, 0)

	if err := d.Prio().SetHighInline(rule, 0); err != nil {
		t.Fatal(err)
	}
	step("queue, one in flight: stays in the NIC poll", hi, xdpPass, true, 2, Stay)
	drainFlows(t, d)
	step("queue, none in flight: back in the queue", hi, xdpRedirect, true, 1, 0)
	// A flow that started in the NIC poll and has nothing in flight
	// still waits: its frames there were never counted, so it starts
	// marking and counting them (a UDP datagram ends its segment: at
	// once), and moves only once one was counted and none is in flight.
	step("queue, never counted: stays in the NIC poll, marked", other, xdpPass, true, 1, Stay)
	step("queue, one in flight: stays in the NIC poll", other, xdpPass, true, 2, Stay)
	drainFlows(t, d)
	step("queue, counted and none in flight: in the queue", other, xdpRedirect, true, 1, 0)
	if got := stats(t, d)[StageSplit].High; got != 10 {
		t.Errorf("high-priority frames counted %d, want 10", got)
	}
	if got, err := d.Prio().HighRuleFrames(); err != nil || got[rule] != 9 || got[light] != 1 || len(got) != 2 {
		t.Errorf("HighRuleFrames %v (%v), want 9 for %s and 1 for %s", got, err, rule, light)
	}

	// A new config puts every rule's flows back in their queue; DelRule
	// drops the rule's switch and count; a config without high=auto makes
	// the programs ignore the switches.
	for _, r := range []Rule{rule, light} {
		if err := d.Prio().SetHighInline(r, switchUntil(true)); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if on, _ := d.Prio().HighInline(); len(on) != 0 {
		t.Errorf("SetConfig kept the runtime switches %v", on)
	}
	if err := d.Prio().SetHighInline(light, switchUntil(true)); err != nil {
		t.Fatal(err)
	}
	if err := d.Prio().DelRule(light); err != nil {
		t.Fatal(err)
	}
	if on, _ := d.Prio().HighInline(); len(on) != 0 {
		t.Errorf("a deleted rule's switch kept: %v", on)
	}
	if got, _ := d.Prio().HighRuleFrames(); len(got) != 1 {
		t.Errorf("a deleted rule's count kept: %v", got)
	}
	// A switch set for a rule not in the set (deleted meanwhile) does
	// not stay.
	if err := d.Prio().SetHighInline(light, switchUntil(true)); err == nil {
		t.Error("a switch set for a deleted rule")
	}
	if on, _ := d.Prio().HighInline(); len(on) != 0 {
		t.Errorf("a deleted rule's switch left: %v", on)
	}
	if err := d.Prio().SetHighInline(rule, switchUntil(true)); err != nil {
		t.Fatal(err)
	}
	cfg.HighAutoPPS = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.objs.SteerHighInline.Put(rule.key(), uint64(switchUntil(true))); err != nil {
		t.Fatal(err)
	}
	third := hi
	third.sport = 5002
	step("switch set, config without high=auto: in the queue", third, xdpRedirect, true, 1, 0)
	if on, _ := d.Prio().HighInline(); len(on) != 0 {
		t.Error("HighInline says inline under a config without high=auto")
	}
	if got, _ := d.Prio().HighRuleFrames(); got[rule] != 9 {
		t.Errorf("counted without high=auto: %v", got)
	}
}

// Rule.Matches (what lanes status uses to name a marked flow) decides as
// steer_xdp's classification does, flow by flow, and MarkingRule (what
// names the rule whose high=auto switch moves the flow) names the rule the
// program counted the flow under.
func TestRuleMatchesLikeTheProgram(t *testing.T) {
	d := prioDatapath(t, true, time.Hour)
	// high=auto's per-rule counts show which rule the program took for a
	// flow, which MarkingRule must name (the rule whose switch moves it).
	cfg, _ := d.Config()
	cfg.PrioIdleInline, cfg.HighAutoPPS = true, 5000
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	var rules []Rule
	for _, s := range []string{"dst " + innerDst.String() + " port 80 tcp", "src " + innerSrc.String() + " port 5000 udp", "dst 10.9.9.9",
		"dst " + innerDst.String() + " tcp", "src " + innerSrc.String()} {
		rules = append(rules, addRule(t, d, s))
	}
	var flows []flowSpec
	for _, port := range []uint16{80, 81, 5000} {
		for _, proto := range []uint8{protoTCP, protoUDP} {
			flows = append(flows, flowSpec{src: innerSrc, dst: innerDst, sport: port, dport: port, proto: proto},
				flowSpec{src: innerSrc, dst: innerDst, sport: 40000 + port, dport: port, proto: proto})
		}
	}
	flows = append(flows, flowSpec{src: netip.MustParseAddr("10.7.7.7"), dst: innerDst, sport: 1, dport: 2, proto: protoUDP})
	marked, byRule := 0, map[Rule]bool{}
	for _, f := range flows {
		before, _ := d.Prio().HighRuleFrames()
		runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
		fl := mustFlow(t, d, f, StageSplit)
		got := slices.ContainsFunc(rules, func(r Rule) bool { return r.Matches(fl.Src, fl.Dst, fl.SrcPort, fl.DstPort, fl.Proto) })
		if got != fl.High {
			t.Errorf("flow %+v: Matches %v, the program classified it high %v", f, got, fl.High)
		}
		after, _ := d.Prio().HighRuleFrames()
		var counted []Rule
		for r, n := range after {
			if n != before[r] {
				counted = append(counted, r)
			}
		}
		r, ok := MarkingRule(rules, fl.Src, fl.Dst, fl.SrcPort, fl.DstPort, fl.Proto)
		if ok != got || (ok && !slices.Equal(counted, []Rule{r})) || (!ok && len(counted) != 0) {
			t.Errorf("flow %+v: MarkingRule %v (%v), the program counted it under %v", f, r, ok, counted)
		}
		if got {
			marked++
			byRule[r] = true
		}
	}
	if marked == 0 || marked == len(flows) || len(byRule) < 4 {
		t.Errorf("%d of %d flows marked, by %d rules: the cases do not tell them apart", marked, len(flows), len(byRule))
	}
}

// PRISM high=auto's bulk quiet (Config.BulkQuiet): while no bulk frame
// came for the quiet time (or none yet), high-priority flows run in the
// NIC poll whatever their rule's switch; the first bulk frame ends it,
// and the next high-priority frame then takes its flow back to the queue
// with the fast, in-order move (once none of its frames is in flight).
// Only under high=auto.
func TestPrioBulkQuiet(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	cfg := highAutoConfig(t, d, "bulk quiet", func(c *Config) *time.Duration { return &c.BulkQuiet })
	bulk := udpFlow(6000)
	// No rule yet: nothing is high priority, and bulk frames are not
	// stamped (no clock read on the busy path for nobody).
	runXDP(t, d, vxlanFrame(frameSpec{flow: udpFlow(6001)}))
	if _, seen, _ := d.Prio().SinceBulk(); seen {
		t.Error("bulk stamped while no rule exists")
	}
	addRule(t, d, "dst "+innerDst.String()+" port 7777 udp")
	hi := flowSpec{src: innerSrc, dst: innerDst, sport: 5000, dport: 7777, proto: protoUDP}
	step := placeStep(t, d)
	if quiet, _, seen, err := d.Prio().BulkQuiet(cfg.BulkQuiet); !quiet || seen || err != nil {
		t.Fatalf("before any bulk frame: quiet %v, seen %v (%v)", quiet, seen, err)
	}
	step("no bulk yet: in the NIC poll", hi, xdpPass, 0, Stay)
	step("bulk: its queue", bulk, xdpRedirect, 1, 0)
	if quiet, since, seen, err := d.Prio().BulkQuiet(cfg.BulkQuiet); quiet || !seen || err != nil || since > time.Second {
		t.Fatalf("after a bulk frame: quiet %v, seen %v, since %v (%v)", quiet, seen, since, err)
	}
	step("bulk came: marked and counted in the NIC poll first", hi, xdpPass, 1, Stay)
	drainFlows(t, d)
	step("bulk came, none in flight: in the queue", hi, xdpRedirect, 1, 0)
	// The last bulk frame long ago: quiet again.
	if err := d.objs.SteerBulkSeen.Put(uint32(0), uint64(Now()-time.Second)); err != nil {
		t.Fatal(err)
	}
	step("quiet again, one in flight: stays in the queue", hi, xdpRedirect, 2, 0)
	drainFlows(t, d)
	step("quiet again, none in flight: in the NIC poll", hi, xdpPass, 1, Stay)
	// Frames it does not steer (another VNI, an inner IPv6 packet) are
	// work in the NIC poll too: they end the quiet like bulk once 8 of
	// them come within a tick; the odd one does not.
	clearPassed := func() {
		t.Helper()
		if err := d.objs.SteerBulkSeen.Put(uint32(0), uint64(Now()-time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := d.objs.SteerPassedTick.Put(uint32(0), make([]steerPassedTick, ebpf.MustPossibleCPU())); err != nil {
			t.Fatal(err)
		}
	}
	repeat := func(frame []byte, n uint32) {
		t.Helper()
		ret, err := d.XDP().Run(&ebpf.RunOptions{Data: frame, Repeat: n, Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: loIfindex}})
		if err != nil || ret != xdpPass {
			t.Fatalf("frame it does not steer: verdict %d (%v), want pass", ret, err)
		}
	}
	for _, f := range []frameSpec{{flow: bulk, vni: testVNI + 1}, {flow: bulk, innerEthType: ethIPv6}} {
		clearPassed()
		repeat(vxlanFrame(f), 1)
		if quiet, _, _, _ := d.Prio().BulkQuiet(cfg.BulkQuiet); !quiet {
			t.Errorf("one frame %+v it does not steer ended bulk quiet", f)
		}
		// 8 in one run (one syscall, microseconds): within one tick,
		// unless it straddled a tick boundary; then again.
		ended := false
		for try := 0; try < 3 && !ended; try++ {
			clearPassed()
			repeat(vxlanFrame(f), 8)
			quiet, _, _, _ := d.Prio().BulkQuiet(cfg.BulkQuiet)
			ended = !quiet
		}
		if !ended {
			t.Errorf("8 frames %+v it does not steer in a tick left bulk quiet", f)
		}
	}
	// Without it, bulk is never stamped and the flow keeps its queue.
	cfg.BulkQuiet = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.objs.SteerBulkSeen.Put(uint32(0), uint64(0)); err != nil {
		t.Fatal(err)
	}
	other := hi
	other.sport = 5001
	step("bulk quiet off: a new flow in its queue", other, xdpRedirect, 1, 0)
	runXDP(t, d, vxlanFrame(frameSpec{flow: bulk}))
	if _, seen, _ := d.Prio().SinceBulk(); seen {
		t.Error("bulk stamped with bulk quiet off")
	}
}

// highAutoConfig applies high=auto's config with one of its timed settings
// (field, set to 20ms), after checking that the datapath refuses that
// setting without high=auto, and returns it.
func highAutoConfig(t *testing.T, d *Datapath, what string, field func(*Config) *time.Duration) Config {
	t.Helper()
	cfg, _ := d.Config()
	cfg.PrioIdleInline, cfg.Flowlet = true, time.Hour
	*field(&cfg) = 20 * time.Millisecond
	if err := d.SetConfig(cfg); err == nil {
		t.Errorf("%s without high=auto accepted", what)
	}
	cfg.HighAutoPPS = 5000
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Config(); *field(&got) != 20*time.Millisecond {
		t.Fatalf("config %+v does not read back its %s time", got, what)
	}
	return cfg
}

// placeStep returns a check that runs one frame of a flow through
// steer_xdp and compares its verdict and where the flow is now.
func placeStep(t *testing.T, d *Datapath) func(name string, f flowSpec, verdict uint32, inflight int64, cpu uint32) {
	return func(name string, f flowSpec, verdict uint32, inflight int64, cpu uint32) {
		t.Helper()
		ret, _, _ := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: f}))
		fl := mustFlow(t, d, f, StageSplit)
		if ret != verdict || fl.InFlight != inflight || fl.CPUIndex != cpu {
			t.Errorf("%s: verdict %d in flight %d on %d (%+v), want %d %d on %d", name, ret, fl.InFlight, fl.CPUIndex, fl, verdict, inflight, cpu)
		}
	}
}

// PRISM's bulk=auto (Config.BulkAuto): bulk flows run in the NIC poll
// while every high-priority frame of the window ran there as a busy
// rule's (its high=auto switch on), and take their queue again once a
// marked frame takes its queue; each way with the fast move, so no frame
// overtakes the flow's earlier ones. Neither before a busy rule's first
// frame nor once the window passed without one.
func TestPrioBulkAuto(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	busyRule := addRule(t, d, "dst "+innerDst.String()+" port 7777 udp")
	addRule(t, d, "dst "+innerDst.String()+" port 8888 udp")
	cfg := highAutoConfig(t, d, "bulk auto", func(c *Config) *time.Duration { return &c.BulkAuto })
	busy := flowSpec{src: innerSrc, dst: innerDst, sport: 5000, dport: 7777, proto: protoUDP}
	light := flowSpec{src: innerSrc, dst: innerDst, sport: 5001, dport: 8888, proto: protoUDP}
	bulk := udpFlow(6000)
	step := placeStep(t, d)
	besideBusy := func(name string, want bool) {
		t.Helper()
		if got, err := d.Prio().BulkBesideBusy(cfg.BulkAuto); got != want || err != nil {
			t.Errorf("%s: bulk beside busy %v (%v), want %v", name, got, err, want)
		}
	}
	besideBusy("no marked frame yet", false)
	step("no busy rule: bulk in its queue", bulk, xdpRedirect, 1, 0)
	if err := d.Prio().SetHighInline(busyRule, switchUntil(true)); err != nil {
		t.Fatal(err)
	}
	step("a busy rule's flow starts in the NIC poll", busy, xdpPass, 0, Stay)
	besideBusy("a busy rule's frame, none queued", true)
	step("beside busy, one in flight: bulk stays in its queue", bulk, xdpRedirect, 2, 0)
	drainFlows(t, d)
	if n := stats(t, d)[StageSplit].BulkBeside; n != 0 {
		t.Errorf("%d bulk frames counted beside busy while the flow waited for its queue, want 0", n)
	}
	step("beside busy, none in flight: bulk in the NIC poll", bulk, xdpPass, 1, Stay)
	if n := stats(t, d)[StageSplit].BulkBeside; n != 1 {
		t.Errorf("%d bulk frames counted beside busy, want 1", n)
	}
	drainFlows(t, d)
	step("a light rule's frame takes its queue", light, xdpRedirect, 1, 0)
	besideBusy("a queued marked frame", false)
	step("a queued marked frame, bulk counted out of the NIC poll: back in its queue at once", bulk, xdpRedirect, 1, 0)
	drainFlows(t, d)
	// The window: the queued frame long ago, the busy one now: beside
	// busy again; the busy one long ago too: not.
	longAgo := uint64(Now() - time.Second)
	if err := d.objs.SteerHighSeen.Put(uint32(0), steerHighSeen{Queued: longAgo}); err != nil {
		t.Fatal(err)
	}
	step("a busy rule's frame", busy, xdpPass, 0, Stay)
	besideBusy("the queued frame 1s ago", true)
	if err := d.objs.SteerHighSeen.Put(uint32(0), steerHighSeen{Busy: longAgo, Queued: longAgo}); err != nil {
		t.Fatal(err)
	}
	besideBusy("both 1s ago", false)
	drainFlows(t, d)
	step("no marked frame in the window: bulk keeps its queue", bulk, xdpRedirect, 1, 0)
	// Turning it on again starts both clocks afresh.
	cfg.BulkAuto = 0
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.BulkAuto = 20 * time.Millisecond
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	var seen steerHighSeen
	if err := d.objs.SteerHighSeen.Lookup(uint32(0), &seen); err != nil || seen != (steerHighSeen{}) {
		t.Errorf("bulk=auto's clocks %+v (%v) after it was turned on, want none", seen, err)
	}
}

// PRISM's timed settings (quiet, high=auto's threshold, bulk-quiet,
// bulk=auto, aside-below) survive the knob's value: what apply journals
// and reset and the follower read back.
func TestPrioSetupRoundTrip(t *testing.T) {
	in := Config{Enabled: true, Prio: true, CountSplit: true, PrioIdleInline: true, CPUs: []int{1},
		PrioQuiet: time.Second, HighAutoPPS: 5000, BulkQuiet: 20 * time.Millisecond, BulkAuto: 20 * time.Millisecond, AsideBelow: 50}
	v, s := knobRoundTrip(t, in)
	got := s.Config
	if got.PrioQuiet != in.PrioQuiet || got.HighAutoPPS != in.HighAutoPPS || got.BulkQuiet != in.BulkQuiet || got.BulkAuto != in.BulkAuto || got.AsideBelow != in.AsideBelow || !got.PrioIdleInline {
		t.Errorf("knob value %s decodes to %+v", v, got)
	}
}

// knobRoundTrip encodes a config as the datapath knob's value and decodes
// it back, as reset and the follower read it.
func knobRoundTrip(t *testing.T, c Config) (string, Setup) {
	t.Helper()
	v, err := Setup{Config: c}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	s, err := DecodeSetup(v)
	if err != nil {
		t.Fatal(err)
	}
	return v, s
}

// lanes prio and lanes agent write the datapath at the same time: the
// rules' shapes (lanes prio's) live apart from the config (the agent's
// home switches), so neither write loses the other's. When the shapes
// lived in the config, each read, changed and wrote back the whole entry,
// and an agent's write could drop a shape lanes prio had just reported
// added: that rule's flows were then never classified high.
func TestPrioShapesSurviveConfigWriters(t *testing.T) {
	d := prioDatapath(t, false, 0)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		on := false
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			on = !on
			if err := d.Placement().SetHome(StageContainer, on); err != nil {
				done <- err
				return
			}
		}
	}()
	lost := 0
	for i := range 2000 {
		port := uint16(20000 + i)
		r := addRule(t, d, fmt.Sprintf("dst %s port %d udp", innerDst, port))
		f := udpFlow(40000)
		f.dport = port
		st0 := stats(t, d)[StageSplit]
		runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
		if stats(t, d)[StageSplit].Sub(st0).High != 1 {
			lost++
		}
		if err := d.Prio().DelRule(r); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if lost > 0 {
		t.Errorf("%d of 2000 flows of a rule just added were not classified high while the agent wrote the config", lost)
	}
}

// PRISM's aside-below (Prio.SetAside): while the agent's deadline has not
// passed, bulk and marked flows alike run in the NIC poll, each moved
// there and back with the fast move; a deadline passed (an agent gone) is
// the plan's placement again, and so is a new config. Refused without
// aside-below in the config.
func TestPrioAside(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	addRule(t, d, "dst "+innerDst.String()+" port 8888 udp")
	cfg := highAutoConfig(t, d, "bulk auto", func(c *Config) *time.Duration { return &c.BulkAuto })
	if err := d.Prio().SetAside(Now() + time.Hour); err == nil {
		t.Error("aside without aside-below in the config accepted")
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.AsideBelow = 101 },
		func(c *Config) { c.AsideBelow, c.BulkAuto = 50, 0 },
	} {
		c := cfg
		bad(&c)
		if err := d.SetConfig(c); err == nil {
			t.Errorf("config with aside below %d, bulk auto %v accepted", c.AsideBelow, c.BulkAuto)
		}
	}
	cfg.AsideBelow = 50
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if below, core := d.Prio().AsideConfig(); below != 50 || core != cfg.InlineCPU {
		t.Errorf("aside config %d on core %d, want 50 on %d", below, core, cfg.InlineCPU)
	}
	light := flowSpec{src: innerSrc, dst: innerDst, sport: 5001, dport: 8888, proto: protoUDP}
	bulk := udpFlow(6000)
	step := placeStep(t, d)
	aside := func(name string, want bool) {
		t.Helper()
		if got, err := d.Prio().Aside(); got != want || err != nil {
			t.Errorf("%s: aside %v (%v), want %v", name, got, err, want)
		}
	}
	aside("at the start", false)
	step("bulk in its queue", bulk, xdpRedirect, 1, 0)
	step("a light rule's flow in its queue", light, xdpRedirect, 1, 0)
	if err := d.Prio().SetAside(Now() + time.Hour); err != nil {
		t.Fatal(err)
	}
	aside("deadline ahead", true)
	step("aside, one in flight: bulk stays in its queue", bulk, xdpRedirect, 2, 0)
	drainFlows(t, d)
	step("aside: bulk in the NIC poll", bulk, xdpPass, 1, Stay)
	step("aside: the light rule's flow in the NIC poll", light, xdpPass, 1, Stay)
	drainFlows(t, d)
	if err := d.Prio().SetAside(Now() - time.Second); err != nil {
		t.Fatal(err)
	}
	aside("deadline passed", false)
	step("deadline passed: bulk back in its queue", bulk, xdpRedirect, 1, 0)
	step("deadline passed: the light rule's flow back in its queue", light, xdpRedirect, 1, 0)
	if err := d.Prio().SetAside(Now() + time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	aside("after a new config", false)
}

// The aside pass (bpf/prio.h's aside_pass): stood aside, steer_xdp passes
// frames at once, untracked, but only once the receive core's queues are
// told empty and no frame was counted in for a flowlet gap, so no passed
// frame overtakes one still queued or held marked in the shared GRO cell;
// a lapsed deadline ends it, and every flow that may have had frames
// passed (a state from before, or none, within a flowlet gap of the end)
// leaves the NIC poll for its queue by the usual rules: here not at its
// first frame (an hour's flowlet gap), but by the fast move once a frame
// of it was counted there and none is in flight.
func TestPrioAsidePass(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL and the pass: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	trackQueues(t, d)
	addRule(t, d, "dst "+innerDst.String()+" port 8888 udp")
	cfg := highAutoConfig(t, d, "bulk auto", func(c *Config) *time.Duration { return &c.BulkAuto })
	cfg.AsideBelow = 50
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	light := flowSpec{src: innerSrc, dst: innerDst, sport: 5001, dport: 8888, proto: protoUDP}
	bulk := udpFlow(6000)
	late := udpFlow(6001) // first seen while the pass is on
	step := placeStep(t, d)
	passed := func(name string, f flowSpec, want uint64) {
		t.Helper()
		before := stats(t, d)[StageSplit]
		ret, _ := runXDP(t, d, vxlanFrame(frameSpec{flow: f}))
		got := stats(t, d)[StageSplit].Sub(before)
		if ret != xdpPass || got.Aside != want {
			t.Errorf("%s: verdict %d, %d frames passed aside (%+v), want XDP_PASS and %d", name, ret, got.Aside, got, want)
		}
	}
	// The skb side saw every frame core 0's queues counted in, the last
	// one at markedAt.
	seenAll := func(markedAt uint64) {
		t.Helper()
		var q steerSteerQueue
		if err := d.objs.SteerQueues.Lookup(uint32(0), &q); err != nil {
			t.Fatal(err)
		}
		q.Seen, q.MarkedAt = q.Enq, markedAt
		if err := d.objs.SteerQueues.Put(uint32(0), &q); err != nil {
			t.Fatal(err)
		}
	}

	step("bulk in its queue", bulk, xdpRedirect, 1, 0)
	step("a light rule's flow in its queue", light, xdpRedirect, 1, 0)
	if err := d.Prio().SetAside(Now() + time.Hour); err != nil {
		t.Fatal(err)
	}
	step("aside, two frames queued: no pass, bulk stays in its queue", bulk, xdpRedirect, 2, 0)
	seenAll(uint64(Now()))
	passed("aside, queues empty but a frame counted in just now: no pass", bulk, 0)
	drainFlows(t, d)
	seenAll(0)
	before := mustFlow(t, d, bulk, StageSplit)
	passed("aside, queues empty for a flowlet gap: bulk passed", bulk, 1)
	passed("aside: the light rule's flow passed", light, 1)
	passed("aside: a new flow passed", late, 1)
	if after := mustFlow(t, d, bulk, StageSplit); after.Packets != before.Packets || after.CPUIndex != before.CPUIndex {
		t.Errorf("bulk's state changed while passed: %+v, was %+v", after, before)
	}
	if fl, ok := flowState(t, d, late, StageSplit); ok {
		t.Errorf("a flow first seen while passed has a state: %+v", fl)
	}
	if q := queueOf(t, d, 0); q.Enqueued != q.Seen {
		t.Errorf("frames passed went through the queue's accounting: %+v", q)
	}

	if err := d.Prio().SetAside(Now() - time.Second); err != nil {
		t.Fatal(err)
	}
	// Not to its queue at once: a frame passed may still be in the NIC
	// poll's GRO or the later stages' queues.
	step("deadline passed: bulk from before the pass in the NIC poll", bulk, xdpPass, 0, Stay)
	step("deadline passed: the light rule's flow in the NIC poll", light, xdpPass, 0, Stay)
	step("deadline passed: the flow first seen while passed in the NIC poll", late, xdpPass, 0, Stay)
	// Now each frame is marked and counted in the NIC poll, and once none
	// is in flight the flow moves at once.
	step("bulk counted in the NIC poll", bulk, xdpPass, 1, Stay)
	passed("no pass after the deadline", bulk, 0)
	drainFlows(t, d)
	step("none in flight: bulk back in its queue", bulk, xdpRedirect, 1, 0)
}

// A high=auto switch holds until its deadline: past it, the rule's new
// flows start in their queue again, as an agent that died leaves them
// (the agent renews the deadline at every sample).
func TestPrioHighInlineLapses(t *testing.T) {
	defer pinThread(t, 0)() // PLACE_LOCAL: BPF_PROG_RUN on the config's one core
	d := prioDatapath(t, true, time.Hour)
	cfg, _ := d.Config()
	cfg.HighAutoPPS, cfg.PrioIdleInline, cfg.Flowlet = 5000, true, time.Hour
	if err := d.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	rule := addRule(t, d, "dst "+innerDst.String()+" port 7777 udp")
	start := func(name string, sport uint16, verdict uint32) {
		t.Helper()
		f := flowSpec{src: innerSrc, dst: innerDst, sport: sport, dport: 7777, proto: protoUDP}
		if ret, _, _ := runXDPMeta(t, d, vxlanFrame(frameSpec{flow: f})); ret != verdict {
			t.Errorf("%s: verdict %d, want %d", name, ret, verdict)
		}
	}
	if err := d.Prio().SetHighInline(rule, Now()+time.Hour); err != nil {
		t.Fatal(err)
	}
	if on, _ := d.Prio().HighInline(); len(on) != 1 {
		t.Fatalf("premise: the switch is on before its deadline: %v", on)
	}
	start("before the deadline: a new flow starts in the NIC poll", 5000, xdpPass)
	// A deadline a second back has passed for the programs too, which
	// read the coarse clock (up to a tick behind).
	if err := d.Prio().SetHighInline(rule, Now()-time.Second); err != nil {
		t.Fatal(err)
	}
	if on, _ := d.Prio().HighInline(); len(on) != 0 {
		t.Errorf("HighInline %v past the deadline", on)
	}
	start("past the deadline: a new flow starts in its queue", 5001, xdpRedirect)
}

// switchUntil is the deadline of a high=auto switch (Prio.SetHighInline)
// on for the rest of a test, or off (0).
func switchUntil(on bool) time.Duration {
	if on {
		return Now() + time.Hour
	}
	return 0
}
