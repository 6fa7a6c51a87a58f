package steer

import (
	"slices"
	"testing"
)

// ProgramNames: every program of the object, as the kernel names it (at
// most 15 characters), none two alike: a reader of the kernel's statistics
// tells them apart by name.
func TestProgramNames(t *testing.T) {
	names, err := ProgramNames()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, "steer_xdp") {
		t.Errorf("names %q: want steer_xdp", names)
	}
	for i, n := range names {
		if len(n) > 15 {
			t.Errorf("%q: longer than the kernel keeps", n)
		}
		if i > 0 && names[i-1] == n {
			t.Errorf("%q twice: two programs the statistics cannot tell apart", n)
		}
	}
	t.Log(names)
}
