package cli

// The modes the tests apply: cmd/lanes registers them in the binary.
import (
	"strings"
	"testing"

	_ "github.com/lanesnet/lanes/policy/falcon"
	_ "github.com/lanesnet/lanes/policy/mflow"
	_ "github.com/lanesnet/lanes/policy/prism"
)

// lanes modes lists a policy's settings for comparison or diagnosis (x-)
// after its others, under a heading of their own, by their current keys
// alone.
func TestModesListsComparisonSettingsApart(t *testing.T) {
	var b strings.Builder
	cmd := newModesCmd()
	cmd.SetOut(&b)
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	out := "\n" + b.String()
	i := strings.Index(out, "\nfalcon ")
	if i < 0 {
		t.Fatalf("no falcon mode listed:\n%s", out)
	}
	falcon, _, _ := strings.Cut(out[i:], "\nfalcon-")
	head := strings.Index(falcon, "for comparison or diagnosis (x-):")
	if head < 0 {
		t.Fatalf("falcon's settings have no comparison heading:\n%s", falcon)
	}
	for _, k := range []string{"x-stay", "x-bare", "x-park"} {
		if j := strings.Index(falcon, "--set "+k+"="); j < head {
			t.Errorf("--set %s= not listed after the heading:\n%s", k, falcon)
		}
	}
	if j := strings.Index(falcon, "--set spread="); j < 0 || j > head {
		t.Errorf("--set spread= not listed before the heading:\n%s", falcon)
	}
	for _, old := range []string{"--set stay=", "--set bare=", "--set park="} {
		if strings.Contains(out, old) {
			t.Errorf("the old key %s is listed:\n%s", old, out)
		}
	}
	// falcon's and mflow's (x-reorder-check): the policies with such settings.
	if n := strings.Count(out, "for comparison or diagnosis (x-):"); n != 2 {
		t.Errorf("%d comparison headings, want falcon's and mflow's:\n%s", n, out)
	}
}
