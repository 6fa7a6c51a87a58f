package cli

// The modes the tests apply: cmd/lanes registers them in the binary.
import (
	"strings"
	"testing"

	_ "github.com/lanesnet/lanes/policy/falcon"
	_ "github.com/lanesnet/lanes/policy/fast"
	_ "github.com/lanesnet/lanes/policy/mflow"
	_ "github.com/lanesnet/lanes/policy/prism"
)

// lanes modes names a policy's settings for comparison or diagnosis (x-)
// on one line after its others, by their current keys alone; with --all
// it describes them under a heading of their own.
func TestModesListsComparisonSettingsApart(t *testing.T) {
	modes := func(args ...string) string {
		t.Helper()
		var b strings.Builder
		cmd := newModesCmd()
		cmd.SetOut(&b)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return "\n" + b.String()
	}
	falconOf := func(out string) string {
		t.Helper()
		i := strings.Index(out, "\nfalcon ")
		if i < 0 {
			t.Fatalf("no falcon mode listed:\n%s", out)
		}
		falcon, _, _ := strings.Cut(out[i:], "\nfalcon-")
		return falcon
	}
	xKeys := []string{"x-fallback", "x-damp", "x-sampler", "x-agent-sched", "x-stay", "x-bare", "x-park"}
	out := modes()
	falcon := falconOf(out)
	line := strings.Index(falcon, "for comparison or diagnosis:")
	if line < 0 {
		t.Fatalf("falcon's settings have no comparison line:\n%s", falcon)
	}
	for _, k := range xKeys {
		if j := strings.Index(falcon, k); j < line || strings.Contains(falcon, "--set "+k+"=") {
			t.Errorf("%s not named on the comparison line alone:\n%s", k, falcon)
		}
	}
	if j := strings.Index(falcon, "--set spread="); j < 0 || j > line {
		t.Errorf("--set spread= not listed before the comparison line:\n%s", falcon)
	}
	// A policy's own settings and its header fit on a screen.
	if n := strings.Count(falcon, "\n"); n > 24 {
		t.Errorf("falcon takes %d lines:\n%s", n, falcon)
	}
	// falcon's, mflow's (x-reorder-check), fast's (x-interval, x-idle)
	// and prism's (x-fast): the policies with such settings.
	if n := strings.Count(out, "for comparison or diagnosis:"); n != 4 {
		t.Errorf("%d comparison lines, want falcon's, mflow's, fast's and prism's:\n%s", n, out)
	}

	out = modes("--all")
	falcon = falconOf(out)
	head := strings.Index(falcon, "for comparison or diagnosis (x-):")
	if head < 0 {
		t.Fatalf("--all: falcon's settings have no comparison heading:\n%s", falcon)
	}
	for _, k := range xKeys {
		if j := strings.Index(falcon, "--set "+k+"="); j < head {
			t.Errorf("--all: --set %s= not listed after the heading:\n%s", k, falcon)
		}
	}
	for _, old := range []string{"--set stay=", "--set bare=", "--set park=", "--set damp=", "--set fallback=", "--set sampler=", "--set agent-sched="} {
		if strings.Contains(out, old) {
			t.Errorf("the old key %s is listed:\n%s", old, out)
		}
	}
}
