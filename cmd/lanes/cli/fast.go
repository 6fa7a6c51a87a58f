package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/internal/netnsx"
)

func init() { register(newFastCmd) }

func newFastCmd() *cobra.Command {
	var netns string
	cmd := &cobra.Command{
		Use:   "fast list|flush",
		Short: "List or flush the flows on the fast path into the container",
		Long: `fast shows the flows the fast path carries straight from the underlay into
their container (list), or deletes them all (flush). Flushing is always
safe: each flow's next frame takes the kernel's own path, which teaches its
entry again where it delivers the frame.

  lanes fast list --netns lanes-h2
  lanes fast flush --netns lanes-h2`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || (args[0] != "list" && args[0] != "flush") {
				return fmt.Errorf("fast needs list or flush, and nothing else")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := netnsx.CheckName(netns); err != nil {
				return err
			}
			f, err := control.OpenFast(netns)
			if err != nil {
				return err
			}
			defer f.Close()
			out := cmd.OutOrStdout()
			if args[0] == "flush" {
				n, err := f.Flush()
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "flushed %d entries\n", n)
				return nil
			}
			es, err := f.List()
			if err != nil {
				return err
			}
			if len(es) == 0 {
				fmt.Fprintln(out, "no flows on the fast path")
			}
			for _, e := range es {
				fmt.Fprintln(out, e)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&netns, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	return cmd
}
