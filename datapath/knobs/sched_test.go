package knobs_test

import (
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
)

func TestSchedFormat(t *testing.T) {
	for _, s := range []string{
		"policy=other prio=0 nice=0",
		"policy=fifo prio=50 nice=0",
		"policy=rr prio=1 nice=0 reset-on-fork",
		"policy=other prio=0 nice=-5",
		"policy=batch prio=0 nice=19",
	} {
		a, err := knobs.ParseSched(s)
		if err != nil {
			t.Errorf("ParseSched(%q): %v", s, err)
			continue
		}
		if got := knobs.FormatSched(a); got != s {
			t.Errorf("FormatSched(ParseSched(%q)) = %q", s, got)
		}
	}
	for _, s := range []string{"", "prio=3", "policy=fifo prio=0", "policy=lol", "policy=other x", "policy=other prio=a"} {
		if _, err := knobs.ParseSched(s); err == nil {
			t.Errorf("ParseSched(%q) succeeded, want an error", s)
		}
	}
}
