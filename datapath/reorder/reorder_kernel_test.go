//go:build linux

package reorder

import (
	"testing"
	"time"
)

// TestPermutation: micro-flows of one flow from two cores, sent scrambled
// (1 before 0, 3 before 2, ...), then racing each other, reach the
// receiver strictly in order through the reassembler, which held frames
// to get there; without it the same sends arrive out of order.
func TestPermutation(t *testing.T) {
	requireQdisc(t)
	const batch, n = 32, 8
	run := func(t *testing.T, qdisc bool) (arrivals, *Loaded) {
		pr := newPair(t)
		var l *Loaded
		if qdisc {
			cfg := DefaultConfig(batch, 2)
			cfg.Timeout = 5e9 // never the watchdog: only completeness releases here
			cfg.SelfCheck = true
			l = pr.withQdisc(t, cfg)
		}
		r := newReceiver(t, pr)
		s := newSender(t, pr, r.Port)
		mfs := flowOf(n, batch)
		// Scrambled: 1, 0, 3, 2.
		for k := 0; k < 4; k += 2 {
			s.send(mfs[k+1], nil)
			s.send(mfs[k], nil)
		}
		// Racing: 4..7, each core its own in order.
		s.sendTogether([2][]microflow{{mfs[4], mfs[6]}, {mfs[5], mfs[7]}})
		return r.read(n*batch, 2e9), l
	}
	t.Run("reassembled", func(t *testing.T) {
		got, l := run(t, true)
		st, err := l.Stats()
		if err != nil {
			t.Fatal(err)
		}
		ooo, ex := got.outOfOrder()
		t.Logf("arrived %d of %d, out of order %d %v; qdisc %+v", len(got), n*batch, ooo, ex, st)
		if len(got) != n*batch || ooo != 0 {
			t.Errorf("arrived %d of %d, %d out of order (%v): want all, in order", len(got), n*batch, ooo, ex)
		}
		if st.Held == 0 || st.Released != st.Held || st.HeldNow != 0 || st.Gaps != 0 || st.Late != 0 || st.Backward != 0 {
			t.Errorf("qdisc counters %+v: want frames held and all released, no gap, none late, none let out backward", st)
		}
	})
	t.Run("without", func(t *testing.T) {
		got, _ := run(t, false)
		ooo, ex := got.outOfOrder()
		t.Logf("arrived %d of %d, out of order %d %v", len(got), n*batch, ooo, ex)
		if ooo == 0 {
			t.Errorf("no frame out of order without the reassembler: the test proves nothing")
		}
	})
}

// waitStats polls l's counters until ok or 10 s pass (TCG is slow; only
// the counts are evidence, never how long they took).
func waitStats(t *testing.T, l *Loaded, what string, ok func(Stats) bool) Stats {
	t.Helper()
	var st Stats
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if st, err = l.Stats(); err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s: qdisc %+v", what, st)
		}
	}
}

// TestLoss: one frame of micro-flow 2 withheld, micro-flow 3 (from the
// other core) is held behind it until the watchdog skips the gap, exactly
// once; then delivery resumes in order and the qdisc is empty.
func TestLoss(t *testing.T) {
	requireQdisc(t)
	const batch, n = 32, 6
	pr := newPair(t)
	cfg := DefaultConfig(batch, 2)
	cfg.Timeout = 300 * time.Millisecond
	l := pr.withQdisc(t, cfg)
	r := newReceiver(t, pr)
	s := newSender(t, pr, r.Port)
	mfs := flowOf(n, batch)
	lost := mfs[2].First + 10
	s.send(mfs[0], nil)
	s.send(mfs[1], nil)
	s.send(mfs[2], func(f int) bool { return f == lost })
	s.send(mfs[3], nil)
	// Micro-flow 2 never completes (31 of 32 frames, and its core sends
	// nothing later): 3 waits until the watchdog gives 2 up.
	st := waitStats(t, l, "the watchdog to skip the gap", func(st Stats) bool { return st.Gaps > 0 && st.HeldNow == 0 })
	if st.Held != batch || st.Released != batch || st.Gaps != 1 {
		t.Errorf("after the gap: qdisc %+v, want micro-flow 3's %d frames held, then released, one gap", st, batch)
	}
	s.send(mfs[4], nil)
	s.send(mfs[5], nil)
	got := r.read(n*batch-1, 2*time.Second)
	ooo, ex := got.outOfOrder()
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	root, err := RootQdisc(pr.A, pr.Dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("arrived %d of %d sent, out of order %d %v; qdisc %+v, qlen %d", len(got), n*batch-1, ooo, ex, st, root.Qlen)
	if len(got) != n*batch-1 || ooo != 0 {
		t.Errorf("arrived %d of %d, %d out of order (%v): want every frame sent, in order", len(got), n*batch-1, ooo, ex)
	}
	if st.Gaps != 1 || st.HeldNow != 0 || st.Late != 0 || root.Qlen != 0 {
		t.Errorf("at the end: qdisc %+v, qlen %d; want exactly one gap, nothing held or queued, nothing late", st, root.Qlen)
	}
}

// TestLimit: micro-flow 0 withheld entirely, the later ones pile up until
// the flow's limit: held never exceeds it; the overflow gives micro-flow 0
// up and releases what was held, in order. Three split cores: the
// per-core rule is off (it would see micro-flow 0's core move on to
// micro-flow 2 and give 0 up at once, see TestCoreMovesOn).
func TestLimit(t *testing.T) {
	requireQdisc(t)
	const batch, n = 32, 8
	pr := newPair(t)
	cfg := DefaultConfig(batch, 3)
	cfg.FlowLimit = 2 * batch
	cfg.Timeout = 60 * time.Second // never the watchdog
	l := pr.withQdisc(t, cfg)
	r := newReceiver(t, pr)
	s := newSender(t, pr, r.Port)
	mfs := flowOf(n, batch)
	for _, mf := range mfs[1:] {
		s.send(mf, nil)
	}
	got := r.read((n-1)*batch, 2*time.Second)
	ooo, ex := got.outOfOrder()
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("arrived %d of %d sent, out of order %d %v; qdisc %+v", len(got), (n-1)*batch, ooo, ex, st)
	if st.HeldMax > uint64(cfg.FlowLimit) || st.Overflows == 0 || st.Gaps != 0 {
		t.Errorf("qdisc %+v: want held at most the limit %d, an overflow, no watchdog gap", st, cfg.FlowLimit)
	}
	if len(got) != (n-1)*batch || ooo != 0 || st.HeldNow != 0 {
		t.Errorf("arrived %d of %d, %d out of order (%v), %d still held: want every frame sent, in order", len(got), (n-1)*batch, ooo, ex, st.HeldNow)
	}
}

// TestCoreMovesOn: MFLOW's own completeness rule. Micro-flow 2 loses a
// frame, so its count never reaches the batch; once its split core (2 % 2)
// delivers a later micro-flow of its own (4), nothing more of 2 can come
// (each split core keeps its micro-flows in order) and 3, held behind it,
// is released at once, with no watchdog.
func TestCoreMovesOn(t *testing.T) {
	requireQdisc(t)
	const batch, n = 32, 6
	pr := newPair(t)
	cfg := DefaultConfig(batch, 2)
	cfg.Timeout = 60 * time.Second // never the watchdog
	l := pr.withQdisc(t, cfg)
	r := newReceiver(t, pr)
	s := newSender(t, pr, r.Port)
	mfs := flowOf(n, batch)
	lost := mfs[2].First + 10
	for _, mf := range mfs {
		s.send(mf, func(f int) bool { return f == lost })
	}
	got := r.read(n*batch-1, 2*time.Second)
	ooo, ex := got.outOfOrder()
	st, err := l.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("arrived %d of %d sent, out of order %d %v; qdisc %+v", len(got), n*batch-1, ooo, ex, st)
	if len(got) != n*batch-1 || ooo != 0 {
		t.Errorf("arrived %d of %d, %d out of order (%v): want every frame sent, in order", len(got), n*batch-1, ooo, ex)
	}
	if st.ByCore != 1 || st.Gaps != 0 || st.Held == 0 || st.HeldNow != 0 {
		t.Errorf("qdisc %+v: want micro-flow 2 completed by its core moving on, frames held then released, no gap", st)
	}
}

// TestSelfCheck: the self-check counts what the qdisc lets out behind a
// later micro-flow of its flow. Micro-flow 0 comes only after the watchdog
// gave it up and micro-flow 1, held behind it, left: its frames pass late,
// each one behind micro-flow 1, and the self-check counts exactly them.
func TestSelfCheck(t *testing.T) {
	requireQdisc(t)
	const batch, n = 32, 2
	pr := newPair(t)
	cfg := DefaultConfig(batch, 3) // three cores: the per-core rule does not give 0 up
	cfg.Timeout = 300 * time.Millisecond
	cfg.SelfCheck = true
	l := pr.withQdisc(t, cfg)
	r := newReceiver(t, pr)
	s := newSender(t, pr, r.Port)
	mfs := flowOf(n, batch)
	s.send(mfs[1], nil)
	waitStats(t, l, "the watchdog to skip micro-flow 0", func(st Stats) bool { return st.Gaps > 0 && st.HeldNow == 0 })
	s.send(mfs[0], nil)
	got := r.read(n*batch, 2*time.Second)
	st := waitStats(t, l, "micro-flow 0 to pass", func(st Stats) bool { return st.Late == batch })
	t.Logf("arrived %d of %d; qdisc %+v", len(got), n*batch, st)
	if st.Backward != batch || st.Released != batch {
		t.Errorf("qdisc %+v: want micro-flow 1's %d frames released, then micro-flow 0's %d passed late and counted backward", st, batch, batch)
	}
}
