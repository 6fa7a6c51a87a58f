package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/topology"
	"github.com/spf13/cobra"
)

func init() { register(newStatusCmd) }

func newStatusCmd() *cobra.Command {
	var (
		o      control.StatusOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status [--netns NAME] [--json]",
		Short: "Show the overlay, the applied mode and what each core is doing",
		Long: `status shows the overlay of a namespace, the mode applied to it, what each
core is doing and what the mode's agent last reported. It exits with 1 when
the applied mode expects an agent (one with a run-time part, or one whose agent
reported since the apply) and none runs, so a health check can call it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := control.Status(o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(s); err != nil {
					return err
				}
			} else {
				ctlPrintStatus(out, s)
			}
			return ctlAgentErr(s)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.NetNS, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	f.StringVar(&o.StateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	f.DurationVar(&o.Sample, "sample", 500*time.Millisecond, "how long to measure core load")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// ctlPrintCoexistence says which host tuning daemons write what lanes
// writes, and what they would fight over.
func ctlPrintCoexistence(out io.Writer, cs []control.Coexist) {
	for _, c := range cs {
		fmt.Fprintf(out, "coexistence: %s runs (pid %d", c.Name, c.PID)
		if len(c.Config) > 0 {
			fmt.Fprintf(out, ", %s", strings.Join(c.Config, ", "))
		}
		fmt.Fprintln(out, "):")
		for _, f := range c.Fights {
			fmt.Fprintf(out, "  %s\n", f)
		}
	}
}

// ctlAgentErr is status's failure when the agent the target expects is
// not running.
func ctlAgentErr(s *control.StatusReport) error {
	why := s.AgentDown()
	if why == "" {
		return nil
	}
	return fmt.Errorf("%s: start it (systemctl start lanes, or lanes agent%s)", why, ctlNSFlag(s.NetNS))
}

func ctlPrintStatus(out io.Writer, s *control.StatusReport) {
	fmt.Fprintf(out, "netns %s: mode %s", ctlNSLabel(s.NetNS), s.Mode)
	if st := s.State; st != nil {
		if st.Phase != control.Applied {
			fmt.Fprintf(out, " (INCOMPLETE: the apply started %s was interrupted; run lanes reset%s)",
				st.Started.Local().Format(time.DateTime), ctlNSFlag(s.NetNS))
		} else {
			fmt.Fprintf(out, " since %s, %d changes on cores %s", st.Applied.Local().Format(time.DateTime), st.Plan.Changes, st.CPUs)
			if len(st.IRQCPUs) > 0 {
				fmt.Fprintf(out, ", IRQ core %s", cpuset.FormatList(st.IRQCPUs))
			} else {
				fmt.Fprint(out, ", IRQ core unknown")
			}
		}
	}
	fmt.Fprintf(out, ", %d knobs journaled\n", s.Journaled)
	if s.OldState != "" {
		fmt.Fprintf(out, "  %s\n", s.OldState)
	}
	if st := s.State; st != nil {
		// What the plan assumed and chose, as apply printed it.
		for _, n := range st.Plan.Notes {
			fmt.Fprintf(out, "  plan: %s\n", n)
		}
	}
	if ms := s.ModeStatus; ms != nil {
		for _, l := range ms.Lines {
			fmt.Fprintf(out, "  %s\n", l)
		}
	} else if s.ModeStatusError != "" {
		fmt.Fprintf(out, "  %s's own status could not be read: %s\n", s.Mode, s.ModeStatusError)
	}
	if t := s.Topology; t != nil {
		ctlPrintTopology(out, t)
	} else {
		fmt.Fprintln(out, s.TopologyError)
	}
	fmt.Fprintf(out, "\ncores over %.1fs:\n", s.SampleSeconds)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CORE\tSOFTIRQ\tSYSTEM\tUSER\tIDLE\tNET_RX/s\tNAPI THREADS\tRPS TO HERE")
	for _, c := range s.Cores {
		var ths, rps []string
		for _, th := range c.Threads {
			tag := "last ran"
			if th.Pinned {
				tag = "pinned"
			}
			if th.Policy == "fifo" || th.Policy == "rr" {
				tag += fmt.Sprintf(" %s/%d", th.Policy, th.Prio)
			}
			ths = append(ths, fmt.Sprintf("%s (%s)", th.Comm, tag))
		}
		for _, q := range c.RPS {
			rps = append(rps, fmt.Sprintf("%s/%s rx-%d", ctlNSLabel(q.NetNS), q.Device, q.Queue))
		}
		fmt.Fprintf(w, "%d\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%.0f\t%s\t%s\n",
			c.CPU, c.SoftIRQ, c.System, c.User, c.Idle, c.NetRXPerSec, ctlOrDash(ths), ctlOrDash(rps))
	}
	w.Flush()
	for _, c := range s.Cores {
		if st := c.Stalled; st != nil {
			fmt.Fprintf(out, "core %d: %s (pid %d) stayed runnable %.0f ms without running: frames queued to it waited as long, behind a task that held the core (docs/falcon.md, what a stock kernel forces)\n", c.CPU, st.Comm, st.PID, st.Ms)
		}
	}
	if a := s.Agent; a != nil {
		if a.Running {
			fmt.Fprintf(out, "\nagent (pid %d, %s, report of %s):\n", a.PID, a.Mode, a.At.Local().Format(time.TimeOnly))
		} else {
			fmt.Fprintf(out, "\nagent NOT RUNNING (last report of pid %d at %s; start it with lanes agent%s):\n", a.PID, a.At.Local().Format(time.DateTime), ctlNSFlag(s.NetNS))
		}
		for _, l := range a.Summary {
			fmt.Fprintf(out, "  %s\n", l)
		}
	} else if s.State != nil && s.State.Plan.Agent != "" {
		// The mode has a run-time part and no agent reports (none ran
		// since the apply, or one stopped cleanly, which removes its
		// report): without it the mode is only half in place (Falcon does
		// not balance, PRISM's guard and sync's destinations are not kept).
		fmt.Fprintf(out, "\nagent NOT RUNNING: this mode's run-time part (%s) runs only in lanes agent%s\n", s.State.Plan.Agent, ctlNSFlag(s.NetNS))
	} else if s.State != nil && s.Steering != nil {
		fmt.Fprintf(out, "\nagent NOT RUNNING: its queue reconciler, which books frames lost where the kernel does not report them, and its container follower run only in lanes agent%s\n", ctlNSFlag(s.NetNS))
	} else if s.State != nil && s.State.Plan.Changes > 0 {
		fmt.Fprintf(out, "\nagent NOT RUNNING: containers started after the apply are adopted only by lanes agent%s\n", ctlNSFlag(s.NetNS))
	}

	if len(s.Coexistence) > 0 {
		fmt.Fprintln(out)
		ctlPrintCoexistence(out, s.Coexistence)
	}

	if st := s.Steering; st != nil {
		fmt.Fprintf(out, "\nsteering (%s):\n", st.PinDir)
		if len(st.Home) > 0 {
			fmt.Fprintf(out, "  at home (vanilla placement, per-flow work off until the IRQ core is busy): %s\n", strings.Join(st.Home, ", "))
		}
		if st.StayQueued {
			fmt.Fprintf(out, "  x-stay=queued: flows staying at the bridge stage pass their core's RPS backlog (one pass more than vanilla)\n")
		}
		for _, c := range s.Cores {
			for i, f := range c.Stages {
				if i == 8 {
					fmt.Fprintf(out, "  core %d: ... %d more\n", c.CPU, len(c.Stages)-i)
					break
				}
				class := ""
				if f.High {
					class = ", high priority"
				}
				if f.Rule != "" {
					class += " (" + f.Rule + ")"
				}
				class += ctlInFlight(f)
				fmt.Fprintf(out, "  core %d: %-9s %s  (%d packets%s)\n", c.CPU, f.Stage, f.Flow, f.Packets, class)
			}
		}
		for i, f := range st.Stay {
			if i == 8 {
				fmt.Fprintf(out, "  stay: ... %d more\n", len(st.Stay)-i)
				break
			}
			how := "runs where its previous stage ran"
			if f.Direct {
				how += ", without the RPS backlog"
			}
			if f.HeldOn >= 0 {
				how += fmt.Sprintf(", queued on core %d", f.HeldOn)
			}
			if f.Inline {
				how = "high priority (" + f.Rule + "), in the NIC poll: " + how
			} else if f.Marked {
				how = "marked high priority (" + f.Rule + "): " + how
			}
			fmt.Fprintf(out, "  stay:   %-9s %s  (%d packets; %s%s)\n", f.Stage, f.Flow, f.Packets, how, ctlInFlight(f))
		}
		if st.Prio {
			fmt.Fprintf(out, "  priority classes on; high priority: %s (lanes prio add)\n", ctlOrDash(st.Rules))
			if st.BulkInlineIdle && len(st.Rules) == 0 {
				fmt.Fprintf(out, "  no flow marked: bulk flows run in the NIC poll, as vanilla, until the first rule sends them to the bulk queue\n")
			} else if st.QuietMs > 0 {
				quietLine(out, "high class", "high-priority frame", st.Quiet, st.SinceHighMs, st.QuietMs,
					"bulk flows run in the NIC poll until the next one", "bulk flows take the bulk queue")
			}
			if st.BulkQuietMs > 0 {
				quietLine(out, "bulk", "bulk frame", st.BulkQuiet, st.SinceBulkMs, st.BulkQuietMs,
					"every high-priority flow runs in the NIC poll until the next one", "high-priority flows take their queue unless their rule is busy")
			}
			if len(st.HighInline) > 0 {
				fmt.Fprintf(out, "  the flows of %s run in the NIC poll now (high=auto: the agent found them busy)\n", strings.Join(st.HighInline, ", "))
			}
			if st.BulkAutoMs > 0 && st.BulkBesideBusy {
				fmt.Fprintf(out, "  bulk=auto: bulk flows run in the NIC poll now: every high-priority frame of the last %dms ran there as a busy rule's (%d bulk frames ran there so)\n", st.BulkAutoMs, st.Stages["split"].BulkBeside)
			} else if st.BulkAutoMs > 0 && len(st.Rules) > 0 && !(st.QuietMs > 0 && st.Quiet) {
				fmt.Fprintf(out, "  bulk=auto: bulk flows take the bulk queue (a high-priority frame took its queue in the last %dms, or no busy rule's frame came; %d bulk frames ran in the NIC poll beside busy ones so far)\n", st.BulkAutoMs, st.Stages["split"].BulkBeside)
			}
			fmt.Fprintf(out, "  split     %d frames of high-priority flows", st.Stages["split"].High)
			if n := st.Stages["split"].Aside; n > 0 {
				fmt.Fprintf(out, "; %d frames passed at once while PRISM stood aside with nothing queued (not classified)", n)
			}
			fmt.Fprintln(out)
		}
		if st.Sync {
			k := st.Stages["split"]
			fmt.Fprintf(out, "  sync on: %d high-priority frames ran to completion, %d took the batch path; destinations: %s\n", k.Sync, k.SyncMiss, ctlOrDash(st.SyncTargets))
			for i, f := range st.Shortcut {
				if i == 8 {
					fmt.Fprintf(out, "  shortcut: ... %d more\n", len(st.Shortcut)-i)
					break
				}
				fmt.Fprintf(out, "  shortcut: %s  (%d packets)\n", f.Flow, f.Packets)
			}
		}
		if st.Fast {
			ctlPrintFast(out, st)
		}
		if len(st.MicroFlows) > 0 || len(st.Elephants) > 0 {
			var per []string
			for _, c := range slices.Sorted(maps.Keys(st.MicroFlows)) {
				per = append(per, fmt.Sprintf("core %d: %d", c, st.MicroFlows[c]))
			}
			fmt.Fprintf(out, "  micro-flows sent: %s\n", ctlOrDash(per))
			for _, e := range st.Elephants {
				fmt.Fprintf(out, "  elephant: %s split at %s, %d micro-flows, %d frames, now on core %d\n", e.Flow, e.Stage, e.MicroFlows, e.Frames, e.CPU)
			}
		}
		for _, name := range []string{"split", "bridge", "container"} {
			k := st.Stages[name]
			fmt.Fprintf(out, "  %-9s steered %d, stayed %d, passed %d, held %d, moved %d (%d before the old queue drained", name, k.Steered, k.Stayed, k.Passed, k.Held, k.Moved, k.Undrained)
			if name == "split" && k.Settled > 0 {
				fmt.Fprintf(out, "; %d waits ended by an empty queue", k.Settled)
			}
			if k.Dropped > 0 {
				fmt.Fprintf(out, "; %d counted frames dropped by the kernel, counted out", k.Dropped)
			}
			fmt.Fprintln(out, ")")
		}
		if !st.LaterDropsTracked {
			fmt.Fprintln(out, "  later stages: drops NOT tracked (skb:kfree_skb not attached): a flow with a dropped frame moves after the drain time")
		}
		ctlPrintQueues(out, st)
		if st.VethClass {
			ctlPrintVethFlows(out, st)
		}
	}
}

// ctlPrintFast shows the fast path into the container: its lease, what
// took it and what did not, by reason, and its flows.
func ctlPrintFast(out io.Writer, st *control.Steering) {
	k := st.Stages["split"]
	lease := "none: every frame takes the kernel's path (is lanes agent running?)"
	if st.FastLease > 0 {
		lease = "lanes agent's, for " + st.FastLease.Round(time.Millisecond).String()
	}
	fmt.Fprintf(out, "  fast path: lease %s; %d frames taken, %d entries admitted, %d overlay frames taught nothing\n", lease, k.Fast, k.FastAdmitted, k.FastUnlearned)
	fmt.Fprintf(out, "  fast path misses: %d no entry, %d other outer facts, %d refused by the path's checks, %d GSO, %d behind their flow's, %d stale (a change), %d no lease, %d idle, %d ended (FIN/RST), %d dropped\n",
		k.FastNoEntry, k.FastOther, k.FastRefused, k.FastGSO, k.FastBehind, k.FastStale, k.FastLease, k.FastIdle, k.FastEnded, k.FastDropped)
	fmt.Fprintf(out, "  fast path out: %d frames sent, %d entries admitted, %d noted packets taught nothing; misses: %d no entry, %d other MAC/TTL/TOS/DF, %d refused by the path's checks, %d stale, %d no lease, %d idle, %d ended (FIN/RST), %d dropped\n",
		k.FastOut, k.FastOutAdmitted, k.FastOutUnlearned, k.FastOutNoEntry, k.FastOutOther, k.FastOutRefused, k.FastOutStale, k.FastOutLease, k.FastOutIdle, k.FastOutEnded, k.FastOutDropped)
	for i, e := range st.FastEntries {
		if i == 8 {
			fmt.Fprintf(out, "  fast: ... %d more\n", len(st.FastEntries)-i)
			break
		}
		fmt.Fprintf(out, "  fast: %s\n", e)
	}
}

// ctlPrintVethFlows shows prism's per-class container queues.
func ctlPrintVethFlows(out io.Writer, st *control.Steering) {
	k := st.Stages["container"]
	fmt.Fprintf(out, "  container queues per class (veth-queues=class): %d skbs to queue 1 (high), %d to queue 0 (bulk), %d passed (not understood, or sent from this host); an skb waited for its flow's old queue %d times; flows changed queue once it was empty %d times, after the drain time %d times\n",
		k.High, k.Stayed, k.Passed, k.Held, k.Settled, k.Undrained)
	for i, f := range st.VethFlows {
		if i == 8 {
			fmt.Fprintf(out, "    ... %d more\n", len(st.VethFlows)-i)
			break
		}
		fmt.Fprintf(out, "    queue %d: %s  (%d in flight)\n", f.Queue, f.Flow, f.InFlight)
	}
}

// ctlPollLabel says where an underlay NIC is polled, as lanes reads it
// (plan.IRQCPUs): by its threaded NAPI kthreads, or in softirq where its
// receive interrupts go.
func ctlPollLabel(u topology.Device) string {
	if len(u.NAPIThreads) > 0 {
		var ths []string
		for _, th := range u.NAPIThreads {
			ths = append(ths, fmt.Sprintf("%s on %s", th.Comm, cpuset.FormatList(th.CPUs)))
		}
		return "threaded NAPI: " + strings.Join(ths, ", ")
	}
	if u.ThreadedNAPI() {
		return "threaded NAPI (threaded=" + u.Threaded + "), no poller thread found: IRQ core unknown"
	}
	var irqs []string
	for _, q := range u.IRQs {
		if q.Receive {
			irqs = append(irqs, fmt.Sprintf("irq %d %s on %s", q.IRQ, q.Name, cpuset.FormatList(q.CPUs)))
		}
	}
	if len(irqs) > 0 {
		l := "softirq NAPI, receive interrupts: " + strings.Join(irqs, ", ")
		if u.PollCPUs() == nil {
			l += " (not each on one core: IRQ core unknown, modes take --set " + plan.IRQKey + "=N)"
		}
		return l
	}
	return "softirq NAPI, no receive interrupt found (its IRQ core cannot be read: modes take --set " + plan.IRQKey + "=N)"
}

func ctlPrintTopology(out io.Writer, t *topology.Topology) {
	fmt.Fprintf(out, "overlay: %s\n", kindLabel[t.Kind])
	for _, v := range t.VXLANs {
		use := "l2"
		if v.L3 {
			use = "l3"
		}
		fmt.Fprintf(out, "  vxlan %s: vni %d port %d %s", v.Name, v.VNI, v.Port, use)
		if v.Master != "" {
			fmt.Fprintf(out, " on %s", v.Master)
		}
		if v.Local.IsValid() {
			fmt.Fprintf(out, " local %s", v.Local)
		}
		if v.Underlay != "" {
			fmt.Fprintf(out, ", underlay %s/%s (%s)", ctlNSLabel(v.UnderlayNetNS), v.Underlay, v.How)
		}
		fmt.Fprintf(out, ", threaded %s\n", v.Threaded)
	}
	for _, u := range t.Underlays {
		fmt.Fprintf(out, "  underlay %s/%s: %s\n", ctlNSLabel(u.NetNS), u.Name, ctlPollLabel(u))
	}
	for _, b := range t.Bridges {
		fmt.Fprintf(out, "  bridge %s: %s\n", b.Name, strings.Join(b.Ports, ", "))
	}
	for _, c := range t.Containers {
		var ifs []string
		for _, i := range c.Interfaces {
			s := i.Name
			if a := ctlFirstGlobal(i.Addrs); a.IsValid() {
				s += " " + a.String()
			}
			if i.HostVeth != "" {
				s += " <-> " + i.HostVeth
			}
			ifs = append(ifs, s)
		}
		fmt.Fprintf(out, "  container %s: %s\n", c.NetNS, strings.Join(ifs, "; "))
	}
	for _, n := range t.Notes {
		fmt.Fprintln(out, "  note:", n)
	}
	for _, n := range plan.GROCellNotes(t) {
		fmt.Fprintln(out, "  warning:", n)
	}
}

func ctlFirstGlobal(ps []netip.Prefix) netip.Prefix {
	for _, p := range ps {
		if !p.Addr().IsLinkLocalUnicast() {
			return p
		}
	}
	return netip.Prefix{}
}

func ctlOrDash(xs []string) string {
	if len(xs) == 0 {
		return "-"
	}
	return strings.Join(xs, ", ")
}

// ctlPrintQueues shows each cpumap queue's accounting: what went in, came
// out and was dropped, and whether moves out of it wait for it to empty.
func ctlPrintQueues(out io.Writer, st *control.Steering) {
	if len(st.Queues) == 0 {
		return
	}
	how := "tracked: a flow leaves once its frames came out or were dropped"
	if !st.QueuesTracked {
		how = "not tracked (the drop tracepoints are not attached): a flow leaves after the drain time"
	}
	fmt.Fprintf(out, "  split-stage queues (cpumap, both classes), %s\n", how)
	for _, q := range st.Queues {
		fmt.Fprintf(out, "    core %d: in %d, out %d, dropped %d (ring %d, kthread %d), queued %d", q.Core, q.Enqueued, q.Seen, q.Dropped(), q.DroppedRing, q.DroppedKthread, q.Queued())
		if q.Lost > 0 {
			fmt.Fprintf(out, ", %d booked lost by lanes agent", q.Lost)
		}
		if q.Untracked {
			fmt.Fprint(out, "; untracked: a frame went in unmarked, drain time from now on")
		}
		fmt.Fprintln(out)
	}
	if n := st.Stages["split"].Unmarked; n > 0 {
		fmt.Fprintf(out, "    %d frames went to a queue unmarked: they came with metadata (a driver's, or an earlier XDP program's) that left no room for lanes' own\n", n)
	}
}

// ctlInFlight notes frames a flow still counts in flight though it has
// been idle a while: a move of that flow waits for them (they are queued
// behind a starved thread, or were lost where nothing reports it).
func ctlInFlight(f control.FlowStage) string {
	if f.IdleMs < 100 || (f.InFlight <= 0 && !f.Uncounted) {
		return ""
	}
	if f.Uncounted {
		return fmt.Sprintf("; %d frames in flight and one uncounted after %d ms idle: a move waits for the drain time", f.InFlight, f.IdleMs)
	}
	return fmt.Sprintf("; %d frames still in flight after %d ms idle: a move waits until they are out", f.InFlight, f.IdleMs)
}

// kindLabel says how an overlay is wired, in the words of the systems that
// wire it that way.
var kindLabel = map[topology.Kind]string{
	topology.Docker:  "L2, VXLAN in a bridge with the containers (Docker-like)",
	topology.Flannel: "routed VXLAN into a container bridge (Flannel-like)",
	topology.Routed:  "routed VXLAN, a routed veth per container (Calico-like)",
}

// quietLine prints the state of a quiet setting (prism's quiet, bulk-quiet):
// whose frames it waits for, when the last one came, and what that means.
func quietLine(out io.Writer, class, frame string, quiet bool, sinceMs *int64, afterMs int64, whileQuiet, whileActive string) {
	last := "none yet"
	if sinceMs != nil {
		last = fmt.Sprintf("%s ago", time.Duration(*sinceMs)*time.Millisecond)
	}
	if quiet {
		fmt.Fprintf(out, "  %s quiet (last %s: %s; quiet after %dms): %s\n", class, frame, last, afterMs, whileQuiet)
		return
	}
	fmt.Fprintf(out, "  %s active (last %s: %s): %s; quiet after %dms without one\n", class, frame, last, whileActive, afterMs)
}
