package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/spf13/cobra"
)

func init() { register(newModesCmd) }

func newModesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "modes",
		Short: "List the modes and the settings each takes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			// Modes of one policy share their settings: list them once.
			shown := map[string]string{}
			for _, m := range plan.Modes() {
				p, _ := plan.Lookup(m)
				fmt.Fprintf(w, "%s\t%s\n", m, p.Summary())
				if pp, ok := p.(plan.ParamPlanner); ok {
					key := fmt.Sprint(pp.Params())
					if first, ok := shown[key]; ok {
						fmt.Fprintf(w, "  (settings as %s)\t\n", first)
						continue
					}
					shown[key] = m
					// Settings for comparison or diagnosis come last, apart.
					for _, cmp := range []bool{false, true} {
						head := cmp
						for _, q := range pp.Params() {
							if q.Comparison() != cmp {
								continue
							}
							if head {
								fmt.Fprintf(w, "  for comparison or diagnosis (%s):\t\n", plan.ComparisonPrefix)
								head = false
							}
							fmt.Fprintf(w, "  --set %s=\t%s (default %s)\n", q.Key, q.Help, q.Default)
						}
					}
				}
			}
			return w.Flush()
		},
	}
}
