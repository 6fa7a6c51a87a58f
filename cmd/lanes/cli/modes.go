package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/spf13/cobra"
)

func init() { register(newModesCmd) }

func newModesCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "modes",
		Short: "List the modes and the settings each takes",
		Long: "List the modes and the settings each takes. Settings for comparison or diagnosis (" + plan.ComparisonPrefix +
			") are named on one line; --all describes them too.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			// Modes of one policy share their settings: list them once.
			shown := map[string]string{}
			for _, m := range plan.Modes() {
				p, _ := plan.Lookup(m)
				fmt.Fprintf(w, "%s\t%s\n", m, p.Summary())
				pp, ok := p.(plan.ParamPlanner)
				if !ok {
					continue
				}
				key := fmt.Sprint(pp.Params())
				if first, ok := shown[key]; ok {
					fmt.Fprintf(w, "  (settings as %s)\t\n", first)
					continue
				}
				shown[key] = m
				// Settings for comparison or diagnosis come last, apart:
				// named on one line, so that a mode's own fit on a screen.
				var cmp []string
				for _, q := range pp.Params() {
					if !q.Comparison() {
						fmt.Fprintf(w, "  --set %s=\t%s (default %s)\n", q.Key, q.Help, q.Default)
					} else {
						cmp = append(cmp, q.Key)
					}
				}
				if len(cmp) == 0 {
					continue
				}
				if !all {
					fmt.Fprintf(w, "  for comparison or diagnosis:\t%s (lanes modes --all)\n", strings.Join(cmp, ", "))
					continue
				}
				fmt.Fprintf(w, "  for comparison or diagnosis (%s):\t\n", plan.ComparisonPrefix)
				for _, q := range pp.Params() {
					if q.Comparison() {
						fmt.Fprintf(w, "  --set %s=\t%s (default %s)\n", q.Key, q.Help, q.Default)
					}
				}
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "describe the settings for comparison or diagnosis too")
	return cmd
}
