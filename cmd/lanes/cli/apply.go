package cli

import (
	"cmp"
	"fmt"
	"io"
	"strings"

	"github.com/lanesnet/lanes/cmd/lanes/config"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func init() { register(newApplyCmd) }

func newApplyCmd() *cobra.Command {
	var (
		o          control.Options
		sets       []string
		configPath string
	)
	cmd := &cobra.Command{
		Use:   "apply --mode MODE [--netns NAME] [--cpus LIST] | apply --config FILE",
		Short: "Apply a receive-processing mode to a namespace's overlay",
		Long: `apply discovers the VXLAN overlay in a network namespace and applies a mode to
it. The previous mode is undone first. Every kernel setting lanes changes is
journaled under the state dir before it is written, so "lanes reset" restores
the originals even after lanes was killed half way.

With --config FILE it applies what the file says (netns, mode, settings, cpus,
priority rules; docs/deploy.md, deploy/lanes.yaml), all of it checked first.

Modes:
` + ctlModeList(),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg *config.Config
			if cmd.Flags().Changed("config") {
				for _, f := range []string{"mode", "netns", "cpus", "state-dir", "set"} {
					if cmd.Flags().Changed(f) {
						return fmt.Errorf("--config and --%s exclude each other: put it in %s", f, configPath)
					}
				}
				if err := noModeFlags(cmd); err != nil {
					return err
				}
				var err error
				if cfg, err = config.Load(configPath); err != nil {
					return err
				}
				if o, err = cfg.Options(); err != nil {
					return err
				}
				if other, err := control.OtherTarget(o.StateDir, o.NetNS); err != nil {
					return err
				} else if other != "" {
					return fmt.Errorf("netns %s is already applied as target %s (the same namespace by another name): reset that target first (lanes reset --all resets every target)", ctlNSLabel(o.NetNS), other)
				}
			} else {
				if o.Mode == "" {
					return fmt.Errorf("give --mode MODE (one of %s) or --config FILE", strings.Join(plan.Modes(), ", "))
				}
				params, err := ctlModeParams(cmd, sets)
				if err != nil {
					return err
				}
				o.Params = params
			}
			st, err := control.Apply(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if cfg != nil {
				if err := setPrioRules(out, st.NetNS, configPath, cfg.Prio); err != nil {
					return resetAfter(out, st.NetNS, o.StateDir, err)
				}
			}
			fmt.Fprintf(out, "applied %s to netns %s: %d changes", st.Mode, ctlNSLabel(st.NetNS), st.Plan.Changes)
			if st.Plan.Changes > 0 {
				fmt.Fprintf(out, " on cores %s", st.CPUs)
			}
			fmt.Fprintln(out)
			for _, n := range st.Plan.Notes {
				fmt.Fprintln(out, "note:", n)
			}
			ctlPrintCoexistence(out, control.Coexistence())
			agentCmd := "lanes agent" + ctlNSFlag(st.NetNS)
			if cfg != nil {
				agentCmd = "lanes agent --config " + configPath
			}
			if st.Plan.Agent != "" {
				fmt.Fprintf(out, "this mode has a run-time part (%s): run `%s` as a service\n", st.Plan.Agent, agentCmd)
			} else if steer.Pinned(plan.PinDir(st.NetNS)) {
				fmt.Fprintf(out, "run `%s` as a service too: its queue reconciler books frames lost where the kernel does not report them, which would otherwise keep flows from moving, and it adopts containers started later\n", agentCmd)
			} else if st.Plan.Changes > 0 {
				fmt.Fprintf(out, "run `%s` as a service too: it adopts containers started later\n", agentCmd)
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
	f.StringVar(&configPath, "config", "", "apply what this file says ("+config.DefaultPath+" on a deployed host; example: deploy/lanes.yaml); excludes the other flags")
	ctlAddModeFlags(f, &sets)
	return cmd
}

// noModeFlags refuses mode flags beside --config.
func noModeFlags(cmd *cobra.Command) error {
	for _, m := range modeFlags {
		if cmd.Flags().Changed(m.name) {
			return fmt.Errorf("--config and --%s exclude each other: put the setting under settings: in the file", m.name)
		}
	}
	return nil
}

// setPrioRules makes a file's priority rules the applied mode's set:
// rules not in the file (added by hand with lanes prio, or kept from an
// earlier version of the file by an apply picked up) are removed, and
// said so.
func setPrioRules(out io.Writer, netns, path string, rules []steer.Rule) error {
	_, removed, err := control.SetPrio(netns, rules)
	for _, r := range removed {
		fmt.Fprintf(out, "high priority: removed %s (not in %s)\n", r, path)
	}
	if err != nil {
		return err
	}
	for _, r := range rules {
		fmt.Fprintf(out, "high priority: %s\n", r)
	}
	return nil
}

// modeFlags are the mode settings with flags of their own; --set KEY=VALUE
// reaches every setting of every mode. Only flags the user gave become
// params, so a mode's defaults stay its own.
var modeFlags = []struct{ name, help string }{
	{"split-cpus", "falcon: cores for the split stage, a list like 2-3 (default: the set minus the IRQ cores); mflow: cores micro-flows go to (default: two cores of the set, the IRQ core among them)"},
	{"split-cores", "mflow: the same as --split-cpus"},
	{"batch", "mflow: frames per micro-flow, 1..65536 (default 256)"},
	{"threshold", "falcon: core load percent above which a core takes no more stages (default 80); mflow: packets/s from which a flow is split (default 10000)"},
	{"interval", "falcon: balancer sampling interval (default 40ms)"},
	{"flowlet", "falcon: idle gap after which a flow's stage may move (default 1ms)"},
	{"pipeline", "falcon: place stages by hash(flow, device): true|false"},
	{"split", "falcon: split the first stage with XDP + cpumap: true|false|auto (off on a veth underlay)"},
	{"balance", "falcon: balance stages by core load: true|false"},
	{"load", "falcon: load figure, rx or busy (default busy)"},
	{"prio-mode", "prism: batch (own queue and kthread per class) or sync (batch, and high-priority frames for plainly bridged containers go from XDP straight to their veth)"},
}

// flagAliases are flags that set the same setting as another flag: the
// issue's --split-cores is mflow's split-cpus, falcon's flag for its own
// split cores.
var flagAliases = map[string]string{"split-cores": "split-cpus"}

func ctlAddModeFlags(f *pflag.FlagSet, sets *[]string) {
	for _, m := range modeFlags {
		f.String(m.name, "", m.help)
	}
	f.StringArrayVar(sets, "set", nil, "mode setting KEY=VALUE (repeatable); `lanes modes` lists them")
}

func ctlModeParams(cmd *cobra.Command, sets []string) (map[string]string, error) {
	params := map[string]string{}
	for _, m := range modeFlags {
		if cmd.Flags().Changed(m.name) {
			v, _ := cmd.Flags().GetString(m.name)
			key := cmp.Or(flagAliases[m.name], m.name)
			if old, dup := params[key]; dup && old != v {
				return nil, fmt.Errorf("--%s and --%s set the same setting: give one", key, m.name)
			}
			params[key] = v
		}
	}
	for _, kv := range sets {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad --set %q: write KEY=VALUE, e.g. --set threshold=70", kv)
		}
		params[k] = v
	}
	if len(params) == 0 {
		return nil, nil
	}
	return params, nil
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
