package prism

import "testing"

// The guard's decisions on synthetic traces: (signal %, core idle %, other
// tasks %) per sample, and the state after each.
func TestGuardRule(t *testing.T) {
	nic := GuardRule{Demote: 85, DemoteAfter: 3, Promote: 10, PromoteAfter: 2}
	bulk := nic
	bulk.Demote, bulk.Tasks = 50, 20
	starve := bulk
	starve.Starved = 95
	type s struct {
		sig, idle, tasks float64
		demoted          bool
	}
	for _, tc := range []struct {
		name  string
		rule  GuardRule
		trace []s
	}{
		{"normal load never demotes", nic, []s{{20, 30, 0, false}, {40, 5, 0, false}, {84, 0, 0, false}, {60, 0, 0, false}, {84, 0, 0, false}}},
		{"a short burst does not", nic, []s{{95, 0, 0, false}, {95, 0, 0, false}, {50, 0, 0, false}, {95, 0, 0, false}, {95, 0, 0, false}}},
		{"overload demotes after three samples, slack promotes after two", nic, []s{
			{95, 0, 0, false}, {90, 0, 0, false}, {99, 0, 0, true},
			// Demoted under continuing overload: the NIC poll's share falls,
			// the core stays busy: no promotion.
			{45, 0, 0, true}, {40, 2, 0, true}, {30, 15, 0, true}, {35, 1, 0, true},
			{10, 40, 0, true}, {10, 40, 0, false},
			// Back on the ladder; overload again.
			{95, 0, 0, false}, {95, 0, 0, false}, {95, 0, 0, true},
		}},
		// Bulk waiting behind softirq and the real-time queue (a light
		// marked service) is left alone; behind applications it is not.
		{"bulk waiting behind receive work is not starved", bulk, []s{{84, 5, 3, false}, {70, 2, 19, false}, {90, 0, 5, false}, {80, 0, 10, false}}},
		{"bulk waiting behind an application is", bulk, []s{
			{70, 5, 40, false}, {60, 2, 25, false}, {90, 0, 5, false}, // broken run
			{70, 5, 40, false}, {60, 2, 25, false}, {55, 0, 20, true},
			// Demoted while the application keeps at least half of its
			// share, whatever bulk's wait; slack ends it.
			{10, 5, 12, true}, {10, 12, 11, true}, {10, 12, 11, false},
		}},
		// The application went away on a core receive work keeps busy:
		// its share under half of Tasks ends it as slack would.
		{"the application's going ends it", bulk, []s{
			{70, 0, 40, false}, {70, 0, 40, false}, {70, 0, 40, true},
			{90, 0, 12, true}, {90, 0, 9, true}, {90, 0, 10, true}, // at half: a blip resets the run
			{90, 0, 5, true}, {90, 0, 4, false},
			// Light service under load: stays where it is.
			{90, 0, 4, false}, {90, 0, 4, false}, {90, 0, 4, false},
		}},
		// Bulk starved by receive work alone (the NIC poll under
		// overload): demoted from Starved's wait whatever the tasks, and
		// only slack ends it; a wait under Starved with no application
		// does not.
		{"overload starves bulk", starve, []s{
			{89, 0, 0, false}, {89, 0, 0, false}, {89, 0, 0, false},
			{97, 0, 0, false}, {98, 0, 0, false}, {99, 0, 1, true},
			{50, 0, 0, true}, {50, 0, 0, true}, {50, 0, 0, true}, {50, 0, 0, true},
			{30, 20, 0, true}, {30, 20, 0, false},
		}},
		// Demoted for an application, the application's going still ends
		// it under overload; the starvation that follows demotes again.
		{"the application's going, then overload", starve, []s{
			{70, 0, 40, false}, {70, 0, 40, false}, {70, 0, 40, true},
			{60, 0, 5, true}, {60, 0, 5, false},
			{95, 0, 0, false}, {95, 0, 0, false}, {95, 0, 0, true},
			{60, 0, 0, true}, {60, 0, 0, true},
		}},
		// Without Tasks (the ladder's guard, or guard-tasks=0) only slack
		// promotes.
		{"no tasks condition, no early promotion", nic, []s{{95, 0, 0, false}, {95, 0, 0, false}, {95, 0, 0, true}, {50, 0, 0, true}, {50, 0, 0, true}, {50, 0, 0, true}}},
	} {
		var st guardState
		for i, smp := range tc.trace {
			changed := st.step(tc.rule, guardSample{signal: smp.sig, idle: smp.idle, tasks: smp.tasks})
			if st.demoted() != smp.demoted {
				t.Fatalf("%s: sample %d (%v): demoted %v, want %v", tc.name, i, smp, st.demoted(), smp.demoted)
			}
			if i > 0 && changed != (tc.trace[i-1].demoted != smp.demoted) {
				t.Errorf("%s: sample %d: changed %v", tc.name, i, changed)
			}
		}
	}
}

// What `lanes status` says of bulk-sched=idle's guard: the wait, the other
// tasks' share and the share from which it acts.
func TestGuardSummary(t *testing.T) {
	st := GuardStatus{Core: 1, Watch: "bulk queue at SCHED_IDLE (bulk-sched=idle)", BulkWait: 72, Tasks: 8, TasksMin: 15, Idle: 3, Sampler: "sched", Threads: []string{"cpumap/1/map:9"}}
	got := st.Summary()
	want := []string{
		"guard on core 1: bulk queue at SCHED_IDLE (bulk-sched=idle); not acting",
		"last sample (from sched): bulk kthread waited 72%, other tasks 8% (acts from 15%), core idle 3%; demotions 0; threads cpumap/1/map:9",
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("summary\n%q\nwant\n%q", got, want)
	}
}
