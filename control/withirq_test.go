package control_test

import (
	"testing"

	"github.com/lanesnet/lanes/control/plan"
)

// A mode that takes the IRQ core is told it; one that does not, or that
// was told already, keeps its settings; the caller's map is not changed.
func TestWithIRQ(t *testing.T) {
	in := map[string]string{"threshold": "70"}
	if got := plan.WithIRQ("falcon", in, 1); got[plan.IRQKey] != "1" || got["threshold"] != "70" || in[plan.IRQKey] != "" {
		t.Errorf("falcon: %v (given %v)", got, in)
	}
	if got := plan.WithIRQ("falcon", map[string]string{plan.IRQKey: "0"}, 1); got[plan.IRQKey] != "0" {
		t.Errorf("falcon told core 0: %v", got)
	}
	if got := plan.WithIRQ("vanilla", nil, 1); got[plan.IRQKey] != "" {
		t.Errorf("vanilla: %v, want no IRQ core", got)
	}
}
