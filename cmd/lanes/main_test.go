package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/cmd/lanes/cli"
)

// The binary's commands see every mode the policies register, whatever
// order Go runs the packages' init in: the bench's --modes help lists
// them (it once listed only the modes registered before the bench's init).
func TestCommandsSeeEveryMode(t *testing.T) {
	root := cli.NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"bench", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"falcon", "mflow", "prism-sync", "rps", "native"} {
		if !strings.Contains(out.String(), m) {
			t.Errorf("bench --help lacks mode %s:\n%s", m, out.String())
		}
	}
}
