package falcon

import (
	"reflect"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control/plan"
)

// The settings for comparison are x-stay, x-bare and x-park. Their old
// keys stay, bare and park, which state files written with them hold in
// their saved params, read as the same settings; Params writes the x-
// keys, and a setting given under both of its keys is refused.
func TestComparisonKeys(t *testing.T) {
	renamed := map[string]string{"stay": "x-stay", "bare": "x-bare", "park": "x-park"}
	values := map[string]string{"x-stay": StayQueued, "x-bare": "false", "x-park": "false"}

	// Each alone, and all three together.
	cases := []map[string]string{}
	for k, v := range values {
		cases = append(cases, map[string]string{k: v})
	}
	cases = append(cases, values)
	for _, cur := range cases {
		old := map[string]string{}
		for k, v := range cur {
			old[strings.TrimPrefix(k, plan.ComparisonPrefix)] = v
		}
		want, err := Parse(Defaults(), cur)
		if err != nil {
			t.Fatalf("%v: %v", cur, err)
		}
		got, err := Parse(Defaults(), old)
		if err != nil {
			t.Fatalf("%v: %v", old, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v parses to %+v, want %+v as from %v", old, got, want, cur)
		}
		if err := plan.CheckParams(mustLookup(t, "falcon"), old); err != nil {
			t.Errorf("%v: %v, want the old keys accepted", old, err)
		}
	}
	o, err := Parse(Defaults(), values)
	if err != nil {
		t.Fatal(err)
	}
	if o.Stay != StayQueued || o.Bare || o.Park {
		t.Errorf("%v: stay %q, bare %v, park %v", values, o.Stay, o.Bare, o.Park)
	}
	for old := range renamed {
		if !plan.Takes("falcon", old) {
			t.Errorf("Takes(falcon, %s) = false, want the old key taken", old)
		}
	}

	// Params writes the x- keys, and what it writes parses back to the
	// same options, also from the old keys, as a saved state from a
	// lanes that wrote them holds them.
	for _, o := range []Options{Defaults(), o} {
		p := o.Params()
		for old, cur := range renamed {
			if _, ok := p[old]; ok {
				t.Errorf("Params has the old key %s: %v", old, p)
			}
			if _, ok := p[cur]; !ok {
				t.Errorf("Params lacks %s: %v", cur, p)
			}
		}
		back, err := Parse(Options{}, p)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, o) {
			t.Errorf("round trip: %+v, want %+v", back, o)
		}
		saved := map[string]string{}
		for k, v := range p {
			if _, ok := renamed[strings.TrimPrefix(k, plan.ComparisonPrefix)]; ok {
				k = strings.TrimPrefix(k, plan.ComparisonPrefix)
			}
			saved[k] = v
		}
		fromOld, err := Parse(Options{}, saved)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fromOld, o) {
			t.Errorf("round trip from the old keys: %+v, want %+v", fromOld, o)
		}
	}

	// Both keys of one setting: one line naming both, also when they
	// agree.
	for old, cur := range renamed {
		for _, v := range []string{values[cur], Defaults().Params()[cur]} {
			_, err := Parse(Defaults(), map[string]string{old: v, cur: values[cur], "threshold": "70"})
			if err == nil {
				t.Errorf("%s and %s both given: no error", old, cur)
				continue
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, old+" and "+cur) || !strings.HasPrefix(msg, "falcon ") {
				t.Errorf("%s and %s both given: %q, want one falcon line naming both", old, cur, msg)
			}
		}
	}
}
