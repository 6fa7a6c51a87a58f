package balancer

import (
	"math"
	"slices"
	"strings"
	"testing"
)

const eps = 1e-9

func mustNew(t *testing.T, c Config) *Balancer {
	t.Helper()
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// settle feeds the same sample until the moving averages equal it (0.8^200
// is far below float precision at these magnitudes).
func settle(b *Balancer, sample map[int]float64) {
	for range 200 {
		b.Observe(sample)
	}
}

// settleWork is settle with each core's movable work (nil: none fed).
func settleWork(b *Balancer, sample, work map[int]float64) {
	for range 200 {
		b.Observe(sample)
		if work != nil {
			b.ObserveWork(work)
		}
	}
}

func TestMovingAverage(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1, 2}))
	trace := []map[int]float64{
		{0: 100, 1: 50},          // core 2 missing: keeps its average
		{0: 100, 1: 50, 2: 10},   //
		{0: 0, 1: 150, 2: -5},    // clamped to 100 and 0
		{0: 50, 1: math.NaN()},   // NaN reads as idle
		{0: 50, 1: 50, 7: 100.0}, // core 7 is not in the set
	}
	var want [3]float64
	for step, s := range trace {
		b.Observe(s)
		for cpu := range want {
			v, ok := s[cpu]
			if !ok {
				if got := b.Load(cpu); math.Abs(got-want[cpu]) > eps {
					t.Errorf("step %d core %d missing from the sample: load %v, want it kept at %v", step, cpu, got, want[cpu])
				}
				continue
			}
			switch {
			case v > 100:
				v = 100
			case !(v >= 0):
				v = 0
			}
			want[cpu] = (4*want[cpu] + v) / 5
			if got := b.Load(cpu); math.Abs(got-want[cpu]) > eps {
				t.Errorf("step %d core %d: load %v, want (4*old+new)/5 = %v", step, cpu, got, want[cpu])
			}
		}
	}
	// Spelled out for the first core: 20, 36, 28.8, 33.04, 36.432.
	if got := b.Load(0); math.Abs(got-36.432) > eps {
		t.Errorf("core 0 after trace: %v, want 36.432", got)
	}
	if got, w := b.Average(), (want[0]+want[1]+want[2])/3; math.Abs(got-w) > eps {
		t.Errorf("average %v, want %v", got, w)
	}
	if got := b.Load(7); got != 0 {
		t.Errorf("core outside the set has load %v", got)
	}
	if got := b.Loads(); len(got) != 3 || math.Abs(got[1]-want[1]) > eps {
		t.Errorf("Loads() = %v, want %v", got, want)
	}
}

func TestPlace(t *testing.T) {
	cases := []struct {
		name   string
		cpus   []int
		avoid  []int
		loads  map[int]float64
		hashed int
		core   int
		reason string
	}{
		{"under threshold stays hashed", []int{0, 1, 2, 3}, nil,
			map[int]float64{0: 79, 1: 0, 2: 0, 3: 0}, 0, 0, "hashed"},
		// A blind second hash of this flow could land on core 1, at 90%:
		// no better than staying. The least-loaded core is 2.
		{"over threshold goes to least loaded, not a rehash", []int{0, 1, 2, 3}, nil,
			map[int]float64{0: 95, 1: 90, 2: 10, 3: 50}, 0, 2, "rehashed: core 0 at 95%"},
		{"tie goes to lowest core", []int{3, 2, 1, 0}, nil,
			map[int]float64{0: 95, 1: 10, 2: 10, 3: 10}, 0, 1, "rehashed: core 0 at 95%"},
		{"tie avoids the IRQ core", []int{0, 1, 2, 3}, []int{1},
			map[int]float64{0: 95, 1: 10, 2: 10, 3: 10}, 0, 2, "rehashed: core 0 at 95%"},
		{"avoid only breaks ties", []int{0, 1, 2, 3}, []int{1},
			map[int]float64{0: 95, 1: 5, 2: 10, 3: 10}, 0, 1, "rehashed: core 0 at 95%"},
		{"candidates must be under threshold", []int{0, 1, 2}, nil,
			map[int]float64{0: 90, 1: 85, 2: 20}, 1, 2, "rehashed: core 1 at 85%"},
		{"hashed outside the set is kept", []int{0, 1}, nil,
			map[int]float64{0: 95, 1: 30}, 5, 5, "hashed: core 5 not in the set"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig(tc.cpus)
			c.Avoid = tc.avoid
			b := mustNew(t, c)
			settle(b, tc.loads)
			if b.FallenBack() {
				t.Fatalf("set fell back at average %v; fix the case", b.Average())
			}
			d := b.Place(tc.hashed)
			if d.Core != tc.core || d.Vanilla || d.Reason != tc.reason {
				t.Errorf("Place(%d) = %+v, want core %d reason %q", tc.hashed, d, tc.core, tc.reason)
			}
		})
	}
}

// TestPlaceNoCoreUnder covers cores all at or over the threshold with the
// set not fallen back. Observe cannot produce it (such an average is at the
// threshold, so the fallback wins), but Place must still not move a stage
// from one hot core to another if it gets there, e.g. with a lowered
// threshold taking effect before the next sample.
func TestPlaceNoCoreUnder(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	b.load[0], b.load[1] = 90, 85
	if d := b.Place(1); d.Core != 1 || d.Vanilla || d.Reason != "hashed: no core under 80%" {
		t.Errorf("Place(1) = %+v, want to stay hashed on core 1", d)
	}
	if s := b.Stats(); s.Rehashes != 0 {
		t.Errorf("rehashes %d, want 0", s.Rehashes)
	}
}

// A moving average converges to 80 from below without reaching it, so the
// boundary is set directly.
func TestPlaceAtThreshold(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	b.load[0], b.load[1] = 80, 40
	if d := b.Place(0); d.Core != 1 || d.Reason != "rehashed: core 0 at 80%" {
		t.Errorf("Place(0) = %+v: a core at the threshold must count as over", d)
	}
}

func TestFallback(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	type step struct {
		sample   map[int]float64
		n        int
		fallen   bool
		avgAbove float64 // the average is > this after the step
		avgBelow float64 // and < this
	}
	steps := []step{
		// Saturated: average 20, 36, 48.8, 59.04, 67.2, 73.8, 79.0, 83.2.
		{map[int]float64{0: 100, 1: 100}, 7, false, 79, 80},
		{map[int]float64{0: 100, 1: 100}, 1, true, 83, 84},
		// Between threshold-hysteresis and threshold: stays fallen back.
		{map[int]float64{0: 95, 1: 50}, 60, true, 72.4, 72.6},
		{map[int]float64{0: 71, 1: 70}, 60, true, 70.4, 72.6},
		// Under 70 (68.4): resumes.
		{map[int]float64{0: 60, 1: 60}, 1, false, 68, 69},
		// Back over 70 but under 80: stays on.
		{map[int]float64{0: 79, 1: 79}, 60, false, 78.9, 79.1},
	}
	for i, s := range steps {
		for range s.n {
			b.Observe(s.sample)
		}
		avg := b.Average()
		if b.FallenBack() != s.fallen || !(avg > s.avgAbove && avg < s.avgBelow) {
			t.Fatalf("step %d: fallen back %v at average %v, want %v in (%v,%v)", i, b.FallenBack(), avg, s.fallen, s.avgAbove, s.avgBelow)
		}
		d := b.Place(0)
		if s.fallen != d.Vanilla || (d.Vanilla && (d.Core != -1 || !strings.HasPrefix(d.Reason, "fallback: set average "))) {
			t.Fatalf("step %d: Place(0) = %+v while fallen back %v", i, d, s.fallen)
		}
	}
	if s := b.Stats(); s.Fallbacks != 1 || s.Resumes != 1 {
		t.Errorf("stats %+v, want 1 fallback and 1 resume", s)
	}
}

func TestFallbackReason(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	settle(b, map[int]float64{0: 90, 1: 80})
	if d := b.Place(0); d != (Decision{Core: -1, Vanilla: true, Reason: "fallback: set average 85%"}) {
		t.Errorf("Place(0) = %+v", d)
	}
}

// Without hysteresis the set resumes as soon as the average dips under the
// threshold: the margin is what TestFallback's middle steps rely on.
func TestFallbackNoHysteresis(t *testing.T) {
	c := DefaultConfig([]int{0, 1})
	c.Hysteresis = 0
	b := mustNew(t, c)
	settle(b, map[int]float64{0: 100, 1: 100})
	for b.Average() >= 80 {
		b.Observe(map[int]float64{0: 75, 1: 75})
	}
	if b.FallenBack() {
		t.Errorf("still fallen back at average %v with no hysteresis", b.Average())
	}
}

func TestAssign(t *testing.T) {
	cases := []struct {
		name   string
		loads  map[int]float64
		hashed []int
		cur    []int // nil: hashed
		active []bool
		want   []int
	}{
		{"all under threshold: hashed table",
			map[int]float64{0: 70, 1: 10, 2: 10},
			[]int{0, 0, 1, 2}, nil, []bool{true, true, true, true},
			[]int{0, 0, 1, 2}},
		// Core 0 at 100% carries 8 active buckets, 12.5 points each. Two
		// moves bring it under 80; the second sees the first's share on
		// core 1 (20 -> 32.5) and goes to core 2 (30) instead.
		{"relief spreads and stops under threshold",
			map[int]float64{0: 100, 1: 20, 2: 30},
			[]int{0, 0, 0, 0, 0, 0, 0, 0, 1, 2}, nil,
			[]bool{true, true, true, true, true, true, true, true, false, false},
			[]int{1, 2, 0, 0, 0, 0, 0, 0, 1, 2}},
		// Core 0's receive work is 40 of its 100: the active bucket's
		// share (see assignWork).
		{"inactive buckets are not moved off a hot core",
			map[int]float64{0: 100, 1: 20}, // core 2 idle
			[]int{0, 0, 0, 1}, nil, []bool{false, true, false, true},
			[]int{0, 2, 0, 1}},
		// Core 0's bucket (work 50) takes idle core 2, which then
		// projects to 50%. Core 1's bucket finds no target: core 2 has no
		// room for a second 50 under 80, and core 0 projects to 50% but
		// was measured hot, so it is no target until a sample says
		// otherwise.
		{"two hot cores, one idle: only one bucket moves",
			map[int]float64{0: 100, 1: 100, 2: 0}, // average 66.7: not fallen back
			[]int{0, 1}, nil, []bool{true, true},
			[]int{2, 1}},
		{"moved bucket stays while its core is under threshold",
			map[int]float64{0: 75, 1: 60, 2: 0},
			[]int{0, 0}, []int{1, 0}, []bool{true, true},
			[]int{1, 0}},
		{"moved bucket returns when hashed core is under threshold-hysteresis",
			map[int]float64{0: 40, 1: 20},
			[]int{0, 0}, []int{1, 0}, []bool{true, true},
			[]int{0, 0}}, // 40 + 20/1 < 70
		{"return counts the bucket's share",
			map[int]float64{0: 40, 1: 40},
			[]int{0, 0}, []int{1, 0}, []bool{true, true},
			[]int{1, 0}}, // 40 + 40 would put core 0 over 70
		{"inactive moved bucket returns once the hashed core cools",
			map[int]float64{0: 69, 1: 50},
			[]int{0}, []int{1}, []bool{false},
			[]int{0}},
		{"inactive moved bucket waits for hysteresis",
			map[int]float64{0: 75, 1: 50},
			[]int{0}, []int{1}, []bool{false},
			[]int{1}},
		{"moved bucket on an overloaded core moves on",
			map[int]float64{0: 75, 1: 90, 2: 30},
			[]int{0, 1}, []int{1, 1}, []bool{true, true},
			[]int{2, 1}}, // core 1 at 90, 45 each: one move brings it to 45
		// Cores 5 and 6 are not observed: nothing says they are busy.
		{"buckets on cores outside the set stay",
			map[int]float64{0: 75, 1: 20}, // 0 too warm for returns
			[]int{0, 0}, []int{5, 6}, []bool{true, false},
			[]int{5, 6}},
		{"bucket outside the set returns to a cool hashed core",
			map[int]float64{0: 30, 1: 20},
			[]int{0}, []int{5}, []bool{true},
			[]int{0}},
		{"hashed outside the set: no return there, relief as usual",
			map[int]float64{0: 90, 1: 20},
			[]int{5, 5}, []int{0, 1}, []bool{true, true},
			[]int{2, 1}},
		// A core's load is all its buckets' when no work is fed: a bucket
		// carrying a whole hot core would make any core as hot.
		{"no work fed: a bucket carrying a whole core stays",
			map[int]float64{0: 100, 1: 100, 2: 0},
			[]int{0, 1}, nil, []bool{true, true},
			[]int{0, 1}},
		// Core 0's bucket carries 30; core 1 (60, a sender) would be at
		// 90 with it, core 2 (55) at 85: neither has room.
		{"no room for the share: the bucket stays",
			map[int]float64{0: 100, 1: 60, 2: 55},
			[]int{0, 1}, nil, []bool{true, false},
			[]int{0, 1}},
		{"room for the share: the bucket moves",
			map[int]float64{0: 100, 1: 60, 2: 45},
			[]int{0, 1}, nil, []bool{true, false},
			[]int{2, 1}},
	}
	assignWork := map[string]map[int]float64{
		"inactive buckets are not moved off a hot core":            {0: 40},
		"two hot cores, one idle: only one bucket moves":           {0: 50, 1: 50},
		"hashed outside the set: no return there, relief as usual": {0: 30, 1: 10},
		"no room for the share: the bucket stays":                  {0: 30},
		"room for the share: the bucket moves":                     {0: 30},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, DefaultConfig([]int{0, 1, 2}))
			settleWork(b, tc.loads, assignWork[tc.name])
			if b.FallenBack() {
				t.Fatalf("set fell back at average %v; fix the case", b.Average())
			}
			cur := slices.Clone(tc.cur)
			next, moves := b.Assign(tc.hashed, cur, tc.active)
			if !slices.Equal(next, tc.want) {
				t.Errorf("Assign = %v, want %v", next, tc.want)
			}
			base := tc.cur
			if base == nil {
				base = tc.hashed
			}
			var want int
			for i := range base {
				if base[i] != tc.want[i] {
					want++
				}
			}
			if moves != want || b.Stats().Moves != uint64(want) {
				t.Errorf("moves %d, stats %d, want %d", moves, b.Stats().Moves, want)
			}
			if tc.cur != nil && !slices.Equal(cur, tc.cur) {
				t.Errorf("Assign modified current: %v", cur)
			}
		})
	}
}

// TestAssignHome is lanes' "spread when busy": buckets rest on their home
// core (where the kernel runs the stage) and go to their hashed core only
// when home is overloaded.
func TestAssignHome(t *testing.T) {
	cases := []struct {
		name         string
		loads        map[int]float64
		hashed, home []int
		cur          []int // nil: home
		active       []bool
		want         []int
	}{
		{"home under threshold: everything stays home",
			map[int]float64{0: 10, 1: 75, 2: 10},
			[]int{0, 2, 1}, []int{1, 1, 1}, nil, []bool{true, true, true},
			[]int{1, 1, 1}},
		// Core 1 at 90 with 3 active buckets, 30 each: the first goes to
		// its hashed core 0, which brings core 1 to 60.
		{"overloaded home sheds to the hashed core",
			map[int]float64{0: 10, 1: 90, 2: 0},
			[]int{0, 2, 1}, []int{1, 1, 1}, nil, []bool{true, true, true},
			[]int{0, 1, 1}},
		{"hashed core busy: least-loaded instead",
			map[int]float64{0: 85, 1: 90, 2: 20},
			[]int{0, 0}, []int{1, 1}, nil, []bool{true, false},
			[]int{2, 1}},
		{"hashed core is home: least-loaded",
			map[int]float64{0: 30, 1: 95, 2: 50},
			[]int{1}, []int{1}, nil, []bool{true},
			[]int{0}},
		{"inactive buckets stay home",
			map[int]float64{0: 10, 1: 95, 2: 10},
			[]int{0, 2}, []int{1, 1}, nil, []bool{false, false},
			[]int{1, 1}},
		{"moved bucket returns home, not to its hashed core",
			map[int]float64{0: 20, 1: 30, 2: 0},
			[]int{0}, []int{1}, []int{0}, []bool{true},
			[]int{1}}, // 30 + 20 < 70
		{"return counts the share",
			map[int]float64{0: 50, 1: 30, 2: 0},
			[]int{0}, []int{1}, []int{0}, []bool{true},
			[]int{0}}, // 30 + 50 would put home over 70
		// Home's bucket carries 20: its hashed core 0 at 65 would be at
		// 85, core 2 at 55 stays under 80.
		{"hashed core without room for the share: least-loaded with room",
			map[int]float64{0: 65, 1: 90, 2: 55},
			[]int{0}, []int{1}, nil, []bool{true},
			[]int{2}},
	}
	// Each hot home's receive work: what its active bucket takes along.
	homeWork := map[string]map[int]float64{
		"hashed core busy: least-loaded instead":                         {1: 40},
		"hashed core is home: least-loaded":                              {1: 40},
		"hashed core without room for the share: least-loaded with room": {1: 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, DefaultConfig([]int{0, 1, 2}))
			settleWork(b, tc.loads, homeWork[tc.name])
			if b.FallenBack() {
				t.Fatalf("set fell back at average %v; fix the case", b.Average())
			}
			next, _ := b.AssignHome(tc.hashed, tc.home, slices.Clone(tc.cur), tc.active)
			if !slices.Equal(next, tc.want) {
				t.Errorf("AssignHome = %v, want %v", next, tc.want)
			}
		})
	}
}

// TestAssignNoFlapping alternates samples that keep core 0's average just
// around the threshold (81.1, 78.9, 81.1, ...). A rule that keeps a bucket
// home whenever home is under the threshold would move it every sample;
// Assign moves it once, keeps it away while core 0 hovers, and brings it
// back once core 0 has really cooled.
func TestAssignNoFlapping(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	hashed, active := []int{0, 1}, []bool{true, false}
	settleWork(b, map[int]float64{0: 80, 1: 10}, map[int]float64{0: 30, 1: 10})
	table := slices.Clone(hashed)
	total, naive := 0, 0
	naiveHome := true
	for i := range 60 {
		busy := 90.0
		if i%2 == 1 {
			busy = 70
		}
		b.Observe(map[int]float64{0: busy, 1: 10})
		b.ObserveWork(map[int]float64{0: 30, 1: 10})
		var moves int
		table, moves = b.Assign(hashed, table, active)
		total += moves
		if home := b.Load(0) < 80; home != naiveHome {
			naive++
			naiveHome = home
		}
	}
	if naive < 20 {
		t.Fatalf("trace does not straddle the threshold: naive rule moved %d times", naive)
	}
	if total != 1 || table[0] != 1 || table[1] != 1 {
		t.Errorf("%d moves while hovering (naive rule: %d), table %v; want 1 move, bucket 0 on core 1", total, naive, table)
	}
	// Core 0 cools: the bucket returns once 0's load plus its share (core
	// 1's 10%) is under 70, and only once.
	for range 30 {
		b.Observe(map[int]float64{0: 30, 1: 10})
		b.ObserveWork(map[int]float64{0: 30, 1: 10})
		var moves int
		table, moves = b.Assign(hashed, table, active)
		total += moves
	}
	if total != 2 || !slices.Equal(table, hashed) {
		t.Errorf("after cooling: %d moves, table %v; want 2 moves, back to %v", total, table, hashed)
	}
	if got := b.Stats().Moves; got != 2 {
		t.Errorf("stats moves %d, want 2", got)
	}
}

func TestAssignFallenBack(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	settle(b, map[int]float64{0: 100, 1: 100})
	cur := []int{1, 1}
	next, moves := b.Assign([]int{0, 1}, cur, []bool{true, true})
	if moves != 0 || !slices.Equal(next, cur) {
		t.Errorf("fallen back: Assign = %v, %d moves; want current unchanged", next, moves)
	}
}

func TestAssignLengthMismatch(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0}))
	defer func() {
		if recover() == nil {
			t.Error("no panic on mismatched lengths")
		}
	}()
	b.Assign([]int{0, 0}, nil, []bool{true})
}

func TestValidate(t *testing.T) {
	cases := []struct {
		c    Config
		want string // substring of the error; "" for valid
	}{
		{DefaultConfig([]int{0, 1}), ""},
		{Config{CPUs: []int{3}, Threshold: 100, Hysteresis: 0}, ""},
		{Config{Threshold: 80}, "list at least one core"},
		{Config{CPUs: []int{0, 1, 0}, Threshold: 80}, "core 0 listed twice"},
		{Config{CPUs: []int{-1}, Threshold: 80}, "core -1 is negative"},
		{Config{CPUs: []int{0}}, "threshold 0% is outside (0,100]"},
		{Config{CPUs: []int{0}, Threshold: 101}, "outside (0,100]"},
		{Config{CPUs: []int{0}, Threshold: math.NaN()}, "outside (0,100]"},
		{Config{CPUs: []int{0}, Threshold: 80, Hysteresis: -1}, "hysteresis -1 is outside [0,threshold 80)"},
		{Config{CPUs: []int{0}, Threshold: 80, Hysteresis: 80}, "use a smaller margin"},
	}
	for _, tc := range cases {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", tc.c, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one containing %q", tc.c, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "\n"):
			t.Errorf("multi-line error %q", err)
		}
		if _, nerr := New(tc.c); (nerr == nil) != (err == nil) {
			t.Errorf("%+v: New and Validate disagree: %v vs %v", tc.c, nerr, err)
		}
	}
}

func TestNewCopiesConfig(t *testing.T) {
	cpus := []int{2, 0, 1}
	b := mustNew(t, DefaultConfig(cpus))
	cpus[0] = 7
	if got := b.Config().CPUs; !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("config CPUs %v changed with the caller's slice", got)
	}
	b.SetAvoid([]int{1})
	if got := b.Config().Avoid; !slices.Equal(got, []int{1}) {
		t.Errorf("avoid %v", got)
	}
}

// A sampler goroutine observes while a controller places and assigns.
func TestConcurrent(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1, 2, 3}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 500 {
			b.Observe(map[int]float64{0: float64(i % 100), 1: 50})
		}
	}()
	hashed, active := []int{0, 1, 2, 3}, []bool{true, true, true, true}
	table := hashed
	for range 500 {
		b.Place(0)
		table, _ = b.Assign(hashed, table, active)
		_ = b.Stats()
	}
	<-done
}

// FallbackAll: the set falls back only when its least-loaded core reaches
// the threshold, not when one saturated core lifts the average (on two
// cores, the IRQ core at 100% and the core it spreads to at 62% average
// 81%), and resumes once a core is under threshold - hysteresis.
func TestFallbackAll(t *testing.T) {
	avg := mustNew(t, DefaultConfig([]int{0, 1}))
	c := DefaultConfig([]int{0, 1})
	c.Fallback = FallbackAll
	all := mustNew(t, c)
	for _, s := range []struct {
		sample     map[int]float64
		avg, allFB bool
	}{
		{map[int]float64{0: 62, 1: 100}, true, false},
		{map[int]float64{0: 85, 1: 100}, true, true},
		{map[int]float64{0: 75, 1: 100}, true, true},  // min 75: between 70 and 80, stays fallen back
		{map[int]float64{0: 65, 1: 100}, true, false}, // min 65 < 70: resumes; the average (82.5) does not
	} {
		settle(avg, s.sample)
		settle(all, s.sample)
		if avg.FallenBack() != s.avg || all.FallenBack() != s.allFB {
			t.Errorf("%v: fallen back average %v all %v, want %v %v", s.sample, avg.FallenBack(), all.FallenBack(), s.avg, s.allFB)
		}
	}
	if d := all.Place(0); d.Vanilla {
		t.Errorf("Place(0) = %+v with a core under the threshold", d)
	}
	settle(all, map[int]float64{0: 90, 1: 100})
	if d := all.Place(0); d != (Decision{Core: -1, Vanilla: true, Reason: "fallback: every core at 90% or more"}) {
		t.Errorf("Place(0) = %+v", d)
	}
	if err := (Config{CPUs: []int{0}, Threshold: 80, Fallback: "median"}).Validate(); err == nil || !strings.Contains(err.Error(), "average") {
		t.Errorf("Validate accepted fallback median: %v", err)
	}
}

// feedUntil feeds sample until cond holds, at most max times, and returns
// how many samples it took (max+1 if cond never held).
func feedUntil(b *Balancer, sample map[int]float64, max int, cond func() bool) int {
	for n := 1; n <= max; n++ {
		b.Observe(sample)
		if cond() {
			return n
		}
	}
	return max + 1
}

// A set that falls back, resumes and climbs straight back to the threshold
// is carrying the work it spread itself (two cores: the IRQ core at 100%,
// the other at 62% with the moved stages, 20% without them). The first
// fallback is Falcon's; the cycle after it is damped: the set stays spread
// and falls back only a hysteresis margin above the last fallback's
// figure, until it calms down under threshold - hysteresis.
func TestFallbackCycleDamped(t *testing.T) {
	for _, rule := range []string{FallbackAverage, FallbackAll} {
		t.Run(rule, func(t *testing.T) {
			c := DefaultConfig([]int{0, 1})
			c.Fallback = rule
			b := mustNew(t, c)
			spread, home, busier := map[int]float64{0: 62, 1: 100}, map[int]float64{0: 20, 1: 100}, map[int]float64{0: 95, 1: 100}
			if rule == FallbackAll {
				spread = map[int]float64{0: 84, 1: 100}
			}
			fallen := func() bool { return b.FallenBack() }
			if n := feedUntil(b, spread, 200, fallen); n > 200 {
				t.Fatalf("never fell back at %v (figure %.1f)", spread, b.FallbackLoad())
			}
			if n := feedUntil(b, home, 200, func() bool { return !b.FallenBack() }); n > 200 {
				t.Fatalf("never resumed at %v (figure %.1f)", home, b.FallbackLoad())
			}
			// Spread again: the figure passes the threshold within
			// CycleRounds, and the set stays spread.
			var crossed int
			for n := 1; n <= 300; n++ {
				b.Observe(spread)
				if crossed == 0 && b.FallbackLoad() >= c.Threshold {
					crossed = n
				}
				if b.FallenBack() {
					t.Fatalf("fell back again %d samples after resuming (figure %.1f): the cycle was not damped", n, b.FallbackLoad())
				}
			}
			if crossed == 0 || crossed > CycleRounds {
				t.Fatalf("figure crossed the threshold after %d samples; the test needs it within %d", crossed, CycleRounds)
			}
			s := b.Stats()
			if s.Fallbacks != 1 || s.Resumes != 1 || s.Damped != 1 {
				t.Fatalf("stats %+v, want 1 fallback, 1 resume, 1 damped", s)
			}
			if bar := b.FallbackBar(); !(bar >= c.Threshold+c.Hysteresis && bar < c.Threshold+c.Hysteresis+2) {
				t.Fatalf("fallback bar %.1f, want the last fallback's figure (about the threshold) + hysteresis", bar)
			}
			if d := b.Place(0); d.Vanilla {
				t.Fatalf("Place(0) = %+v while damped", d)
			}
			// More load than the set's own: it falls back.
			if n := feedUntil(b, busier, 200, fallen); n > 200 {
				t.Fatalf("never fell back at %v (figure %.1f, bar %.1f)", busier, b.FallbackLoad(), b.FallbackBar())
			}
			// Calm: the bar returns to the threshold once the set has been
			// under threshold - hysteresis past the climb after a resume.
			feedUntil(b, map[int]float64{0: 10, 1: 20}, 200, func() bool { return false })
			if b.FallenBack() || b.FallbackBar() != c.Threshold {
				t.Fatalf("after calm: fallen back %v, bar %.1f, want spread at bar %v", b.FallenBack(), b.FallbackBar(), c.Threshold)
			}
			// A fallback long after the last resume is Falcon's again.
			if n := feedUntil(b, spread, 200, fallen); n > 200 {
				t.Fatalf("never fell back at %v after calming down (figure %.1f)", spread, b.FallbackLoad())
			}
			if s := b.Stats(); s.Fallbacks != 3 || s.Damped != 1 {
				t.Fatalf("stats %+v, want 3 fallbacks, 1 damped", s)
			}
		})
	}
}

// TestSpreadingDamped: stages leaving a saturated IRQ core (spread=busy)
// lift the set's average with the set's own work, as a resume does. Told
// so, the balancer damps the climb to the threshold instead of falling
// back once first; untold (Falcon's rule), it falls back.
func TestSpreadingDamped(t *testing.T) {
	c := DefaultConfig([]int{0, 1})
	home, spread, busier := map[int]float64{0: 20, 1: 100}, map[int]float64{0: 62, 1: 100}, map[int]float64{0: 95, 1: 100}
	for _, told := range []bool{true, false} {
		b := mustNew(t, c)
		for range 30 {
			b.Observe(home)
		}
		if told {
			b.Spreading()
		}
		var crossed int
		for n := 1; n <= 300 && !b.FallenBack(); n++ {
			b.Observe(spread)
			if crossed == 0 && b.FallbackLoad() >= c.Threshold {
				crossed = n
			}
		}
		if crossed == 0 || crossed > CycleRounds {
			t.Fatalf("figure crossed the threshold after %d samples; the test needs it within %d", crossed, CycleRounds)
		}
		s := b.Stats()
		if !told {
			if !b.FallenBack() || s.Fallbacks != 1 || s.Damped != 0 {
				t.Fatalf("untold: fallen back %v, stats %+v: want Falcon's fallback", b.FallenBack(), s)
			}
			continue
		}
		if b.FallenBack() || s.Fallbacks != 0 || s.Damped != 1 {
			t.Fatalf("told: fallen back %v, stats %+v: want the climb damped", b.FallenBack(), s)
		}
		if bar := b.FallbackBar(); bar != c.Threshold+c.Hysteresis {
			t.Fatalf("fallback bar %.1f, want threshold + hysteresis %.1f", bar, c.Threshold+c.Hysteresis)
		}
		// More load than the set's own: it falls back.
		if n := feedUntil(b, busier, 200, b.FallenBack); n > 200 {
			t.Fatalf("never fell back at %v (figure %.1f, bar %.1f)", busier, b.FallbackLoad(), b.FallbackBar())
		}
	}
	// While fallen back, Spreading changes nothing: only a resume does.
	b := mustNew(t, c)
	feedUntil(b, spread, 200, b.FallenBack)
	b.Spreading()
	if n := feedUntil(b, busier, 5, func() bool { return !b.FallenBack() }); n <= 5 {
		t.Fatal("resumed under load after Spreading while fallen back")
	}
	// A fallback long before, at a high load, does not raise the bar of
	// a climb Spreading armed: the bar is the threshold's + hysteresis.
	b = mustNew(t, c)
	feedUntil(b, busier, 200, b.FallenBack)
	calm := map[int]float64{0: 5, 1: 10}
	feedUntil(b, calm, 2*CycleRounds+10, func() bool { return false })
	if b.FallenBack() || b.FallbackBar() != c.Threshold {
		t.Fatalf("after calm: fallen back %v, bar %.1f", b.FallenBack(), b.FallbackBar())
	}
	for range 30 {
		b.Observe(home)
	}
	b.Spreading()
	feedUntil(b, spread, 100, func() bool { return false })
	if b.FallenBack() || b.FallbackBar() != c.Threshold+c.Hysteresis {
		t.Fatalf("spreading after an old fallback at %v: fallen back %v, bar %.1f, want %.1f", busier, b.FallenBack(), b.FallbackBar(), c.Threshold+c.Hysteresis)
	}
	// While a damped bar is up, Spreading does not re-arm damping: the
	// set falls back at the bar, and no damping is counted for it.
	damped := b.Stats().Damped
	b.Spreading()
	feedUntil(b, busier, 200, b.FallenBack)
	if s := b.Stats(); s.Damped != damped {
		t.Fatalf("Spreading with the bar up counted %d more damped cycles", s.Damped-damped)
	}
	// Without damping (Falcon's rule alone) it is a no-op.
	c.Damp = false
	b = mustNew(t, c)
	for range 30 {
		b.Observe(home)
	}
	b.Spreading()
	if n := feedUntil(b, spread, 300, b.FallenBack); n > 300 {
		t.Fatal("Damp off: never fell back")
	}
}

// TestDampedBarCapped: a damped bar never passes 100%, so a set whose
// last fallback came at 95% still falls back once every core is saturated.
func TestDampedBarCapped(t *testing.T) {
	c := DefaultConfig([]int{0, 1})
	b := mustNew(t, c)
	spread, home, full := map[int]float64{0: 62, 1: 100}, map[int]float64{0: 10, 1: 20}, map[int]float64{0: 100, 1: 100}
	resume := func() { feedUntil(b, home, 200, func() bool { return !b.FallenBack() }) }
	feedUntil(b, spread, 200, b.FallenBack)
	resume()
	feedUntil(b, spread, 40, func() bool { return false }) // damped: bar 90
	feedUntil(b, full, 200, b.FallenBack)                  // falls back past 90
	if b.fellAtForTest() < 90 {
		t.Fatalf("fell back at %.1f; the test needs a fallback past the first damped bar", b.fellAtForTest())
	}
	resume()
	if n := feedUntil(b, full, 300, b.FallenBack); n > 300 {
		t.Fatalf("every core at 100%% for 300 samples and no fallback (bar %.1f, figure %.2f)", b.FallbackBar(), b.FallbackLoad())
	}
	if bar := b.FallbackBar(); bar > maxBar {
		t.Fatalf("damped bar %.1f over %d%%", bar, maxBar)
	}
}

// Room: a core other than the one named stays under the limit, which is at
// most the threshold, with the named core's work added.
func TestRoom(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1, 2}))
	work := map[int]float64{0: 10, 1: 15, 2: 10}
	settleWork(b, map[int]float64{0: 90, 1: 95, 2: 85}, work)
	if b.Room(1, 80) {
		t.Errorf("Room(1) with every core at 85%% or more")
	}
	settleWork(b, map[int]float64{0: 90, 1: 95, 2: 70}, work)
	if b.Room(1, 80) {
		t.Errorf("Room(1) with core 2 at 70%%: core 1's work (15) would put it at 85")
	}
	settleWork(b, map[int]float64{0: 90, 1: 95, 2: 60}, work)
	if !b.Room(1, 80) || b.Room(2, 80) {
		t.Errorf("Room(1) %v Room(2) %v with core 2 at 60%%: want true, false", b.Room(1, 80), b.Room(2, 80))
	}
	if b.Room(1, 75) || !b.Room(1, 100) {
		t.Errorf("Room(1, 75) %v Room(1, 100) %v with core 2 at 60%%, core 1's work 15: want false, true (capped at the threshold, 80)", b.Room(1, 75), b.Room(1, 100))
	}
	settleWork(b, map[int]float64{0: 90, 1: 95, 2: 66}, work)
	if b.Room(1, 100) {
		t.Errorf("Room(1, 100) with core 2 at 66%% and core 1's work 15: the limit must be capped at the threshold")
	}
}

// fellAtForTest is the figure the set last fell back at.
func (b *Balancer) fellAtForTest() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fellAt
}

// Work is the core's load until work is fed, then the averaged work,
// clamped as loads are and never above the load.
func TestWork(t *testing.T) {
	b := mustNew(t, DefaultConfig([]int{0, 1}))
	settle(b, map[int]float64{0: 60, 1: 20})
	if w := b.Work(0); math.Abs(w-60) > 0.01 {
		t.Errorf("Work(0) before ObserveWork = %.2f, want the load, 60", w)
	}
	settleWork(b, map[int]float64{0: 60, 1: 20}, map[int]float64{0: 25, 1: 150, 5: 10})
	if w := b.Work(0); math.Abs(w-25) > 0.01 {
		t.Errorf("Work(0) = %.2f, want 25", w)
	}
	if w := b.Work(1); math.Abs(w-20) > 0.01 {
		t.Errorf("Work(1) = %.2f, want its load, 20 (work 150 clamps to 100, capped at the load)", w)
	}
}
