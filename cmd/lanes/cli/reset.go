package cli

import (
	"errors"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/lanesnet/lanes/control"
	"github.com/spf13/cobra"
)

func init() { register(newResetCmd) }

func newResetCmd() *cobra.Command {
	var (
		netns    string
		all      bool
		wait     bool
		stateDir string
	)
	cmd := &cobra.Command{
		Use:   "reset [--netns NAME | --all]",
		Short: "Restore every kernel setting lanes changed",
		Long: `reset writes back the original value of every knob lanes changed in a
namespace (or, with --all, in every namespace it has state for), newest first,
from the journal alone: it works after lanes was killed mid-apply. Knobs whose
device or namespace is gone are skipped and listed.

With --wait, once it reset it waits for SIGTERM or SIGINT: the pods of the
uninstall DaemonSet (deploy/kubernetes/uninstall.yaml) stay up, their node
reset, until it is deleted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if wait {
				defer func() {
					if err == nil {
						ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
						defer stop()
						<-ctx.Done()
					}
				}()
			}
			out := cmd.OutOrStdout()
			if all {
				if cmd.Flags().Changed("netns") {
					return errors.New("--netns and --all exclude each other: give one")
				}
				res, err := control.ResetAll(stateDir)
				if len(res) == 0 && err == nil {
					fmt.Fprintln(out, "nothing to restore")
				}
				for _, r := range res {
					ctlPrintReset(out, r)
				}
				return err
			}
			res, err := control.Reset(netns, stateDir)
			if res != nil {
				ctlPrintReset(out, res)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&netns, "netns", "", "network namespace to reset (default: lanes' own)")
	f.BoolVar(&all, "all", false, "reset every namespace lanes has state for")
	f.BoolVar(&wait, "wait", false, "once reset, wait for SIGTERM or SIGINT (an uninstall pod that stays up)")
	f.StringVar(&stateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	return cmd
}

func ctlPrintReset(out io.Writer, r *control.ResetResult) {
	if r.Nothing {
		fmt.Fprintf(out, "%s: nothing to restore\n", r.Target)
		return
	}
	mode := ""
	if r.Mode != "" {
		mode = " (was " + r.Mode + ")"
	}
	if r.Report == nil {
		fmt.Fprintf(out, "%s%s: not restored\n", r.Target, mode)
		return
	}
	fmt.Fprintf(out, "%s%s: restored %d knobs", r.Target, mode, len(r.Report.Restored))
	if n := len(r.Report.Drift); n > 0 {
		fmt.Fprintf(out, ", %d of them changed by someone else since lanes wrote them", n)
	}
	if n := len(r.Report.Skipped); n > 0 {
		fmt.Fprintf(out, ", skipped %d whose device is gone", n)
	}
	fmt.Fprintln(out)
	for _, s := range r.Report.Drift {
		fmt.Fprintf(out, "  changed by someone else %s: %s\n", s.Key, s.Reason)
	}
	for _, s := range r.Report.Skipped {
		fmt.Fprintf(out, "  skipped %s: %s\n", s.Key, s.Reason)
	}
	for _, s := range r.Report.Failed {
		fmt.Fprintf(out, "  failed %s: %s\n", s.Key, s.Reason)
	}
}
