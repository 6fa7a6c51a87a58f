//go:build linux

package steer

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// setBacklog writes what the agent's sampler would for core.
func setBacklog(t *testing.T, d *Datapath, core uint32, sampled, empty time.Duration) {
	t.Helper()
	v := steerBacklogSeen{SampledNs: uint64(sampled), EmptyNs: uint64(empty)}
	if err := d.objs.SteerBacklog.Put(core, &v); err != nil {
		t.Fatal(err)
	}
}

// backlogCase: a bridge-stage flow on core index 0 with one frame counted
// in flight (never seen), idle since a second ago, whose bucket the table
// then moves to index 1. (BACKLOG_MAX_WAIT_NS is a second: tests that
// must stay short of it restamp the flow.)
func backlogCase(t *testing.T, drain time.Duration) (*Datapath, flowSpec, []byte, []int) {
	t.Helper()
	d := drainDatapath(t, drain)
	cfg, _ := d.Config()
	f := tcpFlow(40000)
	outer := vxlanFrame(frameSpec{flow: f})
	b := Bucket(f.hash(), loIfindex, StageBridge)
	if err := d.SetBucket(StageBridge, b, 0); err != nil {
		t.Fatal(err)
	}
	runTCSegs(t, d.TCIngress(), outer, 0)
	stampFlows(t, d, Now()-time.Second)
	if err := d.SetBucket(StageBridge, b, 1); err != nil {
		t.Fatal(err)
	}
	return d, f, outer, cfg.CPUs
}

// TestBacklogSeenEmptySettles: once the agent read the old core's backlog
// empty after the flow's last frame went in, the flow moves at its flowlet
// gap though its frame was never counted seen (it left the path elsewhere),
// as settled, not undrained: no drain time needed (it is an hour here).
func TestBacklogSeenEmptySettles(t *testing.T) {
	d, f, outer, cpus := backlogCase(t, time.Hour)
	now := Now()
	// Read empty, but before the flow's last frame: proves nothing.
	setBacklog(t, d, uint32(cpus[0]), now, now-2*time.Second)
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 0 {
		t.Fatalf("moved on a backlog read empty before its last frame: %+v", fl)
	}
	stampFlows(t, d, Now()-time.Second)
	setBacklog(t, d, uint32(cpus[0]), Now(), Now())
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 1 || fl.InFlight != 1 {
		t.Errorf("after its backlog was read empty: %+v, want index 1 with only the new frame in flight", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Settled != 1 || st.Undrained != 0 || st.Moved != 1 {
		t.Errorf("counters %+v, want 1 settled move, none undrained", st)
	}
}

// TestBacklogBusyHolds: while the agent reads the old core's backlog
// non-empty after the flow's last frame, the drain time alone does not
// move the flow (its frame may still be queued there); after
// BACKLOG_MAX_WAIT_NS idle it does, undrained. Without samples, the drain
// time rules as before.
func TestBacklogBusyHolds(t *testing.T) {
	const drain = 20 * time.Millisecond
	d, f, outer, cpus := backlogCase(t, drain)
	// Idle past the drain time, well short of BACKLOG_MAX_WAIT_NS.
	stampFlows(t, d, Now()-200*time.Millisecond)
	setBacklog(t, d, uint32(cpus[0]), Now(), 0)
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 0 {
		t.Fatalf("moved on the drain time with its backlog busy: %+v", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Held != 1 {
		t.Errorf("counters %+v, want 1 held", st)
	}
	stampFlows(t, d, Now()-2*time.Second)
	setBacklog(t, d, uint32(cpus[0]), Now(), 0)
	runTCSegs(t, d.TCIngress(), outer, 0)
	if fl := mustFlow(t, d, f, StageBridge); fl.CPUIndex != 1 {
		t.Errorf("still held after 2 s idle: %+v", fl)
	}
	if st := stats(t, d)[StageBridge]; st.Undrained != 1 {
		t.Errorf("counters %+v, want 1 undrained move", st)
	}

	// Samples older than the flow's last frame (the agent stopped): the
	// drain time.
	d2, f2, outer2, cpus2 := backlogCase(t, drain)
	setBacklog(t, d2, uint32(cpus2[0]), Now()-3*time.Second, 0)
	runTCSegs(t, d2.TCIngress(), outer2, 0)
	if fl := mustFlow(t, d2, f2, StageBridge); fl.CPUIndex != 1 {
		t.Errorf("stale samples held the flow past the drain time: %+v", fl)
	}
}

func TestParseBacklogs(t *testing.T) {
	const linux618 = `eb798242 00016067 00000067 00000000 00000000 00000000 00000000 00000000 00000000 0127ef71 00000000 00000000 00000000 00000000 00000000
5c653ee4 000014ce 00000092 00000000 00000000 00000000 00000000 00000000 00000000 00482961 00000000 0000001a 00000003 00000012 00000008
`
	got, err := parseBacklogs([]byte(linux618))
	if err != nil || len(got) != 2 || got[0] != 0 || got[3] != 0x1a {
		t.Errorf("parsed %v (%v), want core 0: 0, core 3: 26", got, err)
	}
	const linux54 = "0000abcd 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n"
	if _, err := parseBacklogs([]byte(linux54)); err == nil || !strings.Contains(err.Error(), "5.10") {
		t.Errorf("an 11-column file: %v, want an error naming the kernel needed", err)
	}
}

// TestBacklogSampler: the agent's sampler writes each online core's
// sample into a pinned datapath, but only while a later stage is steered.
func TestBacklogSampler(t *testing.T) {
	d := drainDatapath(t, time.Hour)
	dir := filepath.Join(bpffsDir(t), "lanes")
	if err := d.Pin(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unpin(dir) })
	s, err := OpenBacklogs(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if on, err := s.laterStagesSteered(); err != nil || on {
		t.Fatalf("later stages steered %v (%v) with every bucket at Stay", on, err)
	}
	if err := d.SetBucket(StageContainer, 7, 1); err != nil {
		t.Fatal(err)
	}
	if on, err := s.laterStagesSteered(); err != nil || !on {
		t.Fatalf("later stages steered %v (%v) with a container bucket on a core", on, err)
	}
	before := Now()
	if err := s.Sample(); err != nil {
		t.Fatal(err)
	}
	online, err := knobs.OnlineCPUs()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range online {
		var v steerBacklogSeen
		if err := d.objs.SteerBacklog.Lookup(uint32(c), &v); err != nil {
			t.Fatal(err)
		}
		if time.Duration(v.SampledNs) < before || time.Duration(v.SampledNs) > Now() {
			t.Errorf("core %d: sampled at %v, want between %v and now", c, time.Duration(v.SampledNs), before)
		}
		if v.EmptyNs != 0 && v.EmptyNs != v.SampledNs {
			t.Errorf("core %d: read empty at %d, sampled at %d: a first sample can only have read it then", c, v.EmptyNs, v.SampledNs)
		}
	}
}
