package cli

import (
	"fmt"
	"strings"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/spf13/cobra"
)

func init() { register(newPrioCmd) }

func newPrioCmd() *cobra.Command {
	var netns string
	cmd := &cobra.Command{
		Use:   "prio add|del|list [RULE]",
		Short: "Manage the high-priority flows of a prism mode",
		Long: `prio changes which inner flows PRISM treats as high priority, at runtime:
the next packet of a matching flow takes the high-priority queue (a flow
changes class once its queued packets have been processed, so it is never
reordered). The set lives in a pinned BPF map: it outlives this command and
a restarted lanes, and goes with lanes reset.

A rule is [dst|src] ADDR [port N] [tcp|udp]: the flow's destination (default)
or source address, and on that side its port and protocol when given.

  lanes prio add dst 198.18.2.21 port 11111 udp --netns lanes-h2
  lanes prio del dst 198.18.2.21 port 11111 udp --netns lanes-h2
  lanes prio list --netns lanes-h2`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("prio needs add, del or list")
			}
			switch args[0] {
			case "list":
				if len(args) > 1 {
					return fmt.Errorf("prio list takes no rule")
				}
			case "add", "del":
				if len(args) == 1 {
					return fmt.Errorf("prio %s needs a rule: [dst|src] ADDR [port N] [tcp|udp]", args[0])
				}
			default:
				return fmt.Errorf("unknown prio action %q: want add, del or list", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var rule steer.Rule
			if args[0] != "list" {
				var err error
				if rule, err = steer.ParseRule(strings.Join(args[1:], " ")); err != nil {
					return err
				}
			}
			if err := netnsx.CheckName(netns); err != nil {
				return err
			}
			set, err := control.OpenPrio(netns)
			if err != nil {
				return err
			}
			defer set.Close()
			out := cmd.OutOrStdout()
			switch args[0] {
			case "add":
				if err := set.Add(rule); err != nil {
					return err
				}
				fmt.Fprintf(out, "high priority: %s\n", rule)
			case "del":
				if err := set.Del(rule); err != nil {
					return err
				}
				fmt.Fprintf(out, "removed: %s\n", rule)
			case "list":
				rules, err := set.List()
				if err != nil {
					return err
				}
				if len(rules) == 0 {
					fmt.Fprintln(out, "no high-priority flows (lanes prio add RULE)")
				}
				for _, r := range rules {
					fmt.Fprintln(out, r)
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&netns, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	return cmd
}
