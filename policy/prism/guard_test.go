package prism

import "testing"

// The guard's decisions on synthetic traces: (NIC poll %, core idle %)
// per sample, and the state after each.
func TestGuardRule(t *testing.T) {
	r := GuardRule{Demote: 85, DemoteAfter: 3, Promote: 10, PromoteAfter: 2}
	type s struct {
		nic, idle float64
		demoted   bool
	}
	for name, trace := range map[string][]s{
		"normal load never demotes": {{20, 30, false}, {40, 5, false}, {84, 0, false}, {60, 0, false}, {84, 0, false}},
		"a short burst does not":    {{95, 0, false}, {95, 0, false}, {50, 0, false}, {95, 0, false}, {95, 0, false}},
		"overload demotes after three samples, slack promotes after two": {
			{95, 0, false}, {90, 0, false}, {99, 0, true},
			// Demoted under continuing overload: the NIC poll's share falls,
			// the core stays busy: no promotion.
			{45, 0, true}, {40, 2, true}, {30, 15, true}, {35, 1, true},
			{10, 40, true}, {10, 40, false},
			// Back on the ladder; overload again.
			{95, 0, false}, {95, 0, false}, {95, 0, true},
		},
	} {
		var st guardState
		for i, smp := range trace {
			changed := st.step(r, smp.nic, smp.idle)
			if st.demoted() != smp.demoted {
				t.Fatalf("%s: sample %d (%v): demoted %v, want %v", name, i, smp, st.demoted(), smp.demoted)
			}
			if i > 0 && changed != (trace[i-1].demoted != smp.demoted) {
				t.Errorf("%s: sample %d: changed %v", name, i, changed)
			}
		}
	}
}
