package cli

import (
	"fmt"
	"strings"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/spf13/cobra"
)

func init() { register(newApplyCmd) }

func newApplyCmd() *cobra.Command {
	var o control.Options
	cmd := &cobra.Command{
		Use:   "apply --mode MODE [--netns NAME] [--cpus LIST]",
		Short: "Apply a receive-processing mode to a namespace's overlay",
		Long: `apply discovers the VXLAN overlay in a network namespace and applies a mode to
it. The previous mode is undone first. Every kernel setting lanes changes is
journaled under the state dir before it is written, so "lanes reset" restores
the originals even after lanes was killed half way.

Modes:
` + ctlModeList(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := control.Apply(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "applied %s to netns %s: %d changes", st.Mode, ctlNSLabel(st.NetNS), st.Plan.Changes)
			if st.Plan.Changes > 0 {
				fmt.Fprintf(out, " on cores %s", st.CPUs)
			}
			fmt.Fprintln(out)
			for _, n := range st.Plan.Notes {
				fmt.Fprintln(out, "note:", n)
			}
			if st.Plan.Changes > 0 {
				fmt.Fprintf(out, "undo with: lanes reset%s\n", ctlNSFlag(st.NetNS))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Mode, "mode", "", "mode to apply: "+strings.Join(plan.Modes(), ", "))
	f.StringVar(&o.NetNS, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	f.StringVar(&o.CPUs, "cpus", "", "cores the mode may use, as a list like 0-3,6 (default: all online)")
	f.StringVar(&o.StateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	cmd.MarkFlagRequired("mode")
	return cmd
}

func ctlModeList() string {
	var b strings.Builder
	for _, m := range plan.Modes() {
		p, _ := plan.Lookup(m)
		fmt.Fprintf(&b, "  %-10s %s\n", m, p.Summary())
	}
	return b.String()
}

func ctlNSLabel(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}

func ctlNSFlag(ns string) string {
	if ns == "" {
		return ""
	}
	return " --netns " + ns
}
