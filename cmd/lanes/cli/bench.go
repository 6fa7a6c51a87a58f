package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/lanesnet/lanes/bench"
	"github.com/lanesnet/lanes/bench/report"
	"github.com/lanesnet/lanes/bench/results"
	"github.com/lanesnet/lanes/testbed"
)

func init() { register(newBenchCmd) }

func newBenchCmd() *cobra.Command {
	var o bench.Options
	var forwardRules bool
	var modes, workloads, topo, rates, loads string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure modes side by side on the testbed and write results.json, report.md and plots",
		Long: `bench brings up its own testbed, runs every workload point under every mode,
interleaved (the mode order rotates each repeat) and repeated, and writes
results.json, report.md (median [min-max], ratios vs vanilla and native) and
PNG plots into --out. Knobs are restored and the testbed removed at the end,
also on Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Modes = splitList(modes)
			o.Workloads = splitList(workloads)
			o.Topology = testbed.Topology(topo)
			o.NoForwardRules = !forwardRules
			var err error
			if o.Rates, err = bench.ParseRates(rates); err != nil {
				return err
			}
			if o.Loads, err = bench.ParseLoads(loads); err != nil {
				return err
			}
			o.Progress = cmd.ErrOrStderr()
			o.Args = os.Args
			// The modes' agents run as this binary's `lanes agent`, as
			// deployed, not inside the benchmark's process.
			if self, err := os.Executable(); err == nil {
				o.AgentBinary = self
			}
			bench.Version = Version()
			if err = o.Validate(); err != nil {
				return err
			}
			// Every signal that would end the bench ends it through its
			// cleanup (knobs restored, testbed down): also a closed terminal
			// (SIGHUP) and a reader that went away (SIGPIPE, `lanes bench |
			// head`), which would otherwise kill it on the spot.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
			defer stop()
			f, err := bench.Run(ctx, o)
			if f != nil {
				fmt.Fprintln(cmd.OutOrStdout(), report.Table(f))
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s/results.json, %s/report.md and plots\n", o.Out, o.Out)
			}
			if err != nil && ctx.Err() != nil {
				// The error of whatever step the signal cut short says
				// only "context canceled".
				return fmt.Errorf("interrupted by a signal, cleaned up as at every end; what was measured before it is in %s", o.Out)
			}
			return err
		},
	}
	cmd.AddCommand(newBenchReportCmd())
	fl := cmd.Flags()
	fl.StringVar(&modes, "modes", "native,vanilla,rps", "comma-separated modes to compare: "+strings.Join(bench.KnownModes(), ","))
	fl.StringVar(&workloads, "workloads", "", "comma-separated workloads (default: all; with --quick: "+strings.Join(bench.QuickWorkloads, ",")+")")
	fl.BoolVar(&o.Quick, "quick", false, "fewer points and 2 s measurements (under 5 minutes)")
	fl.StringVar(&o.Out, "out", "out", "directory for results.json, report.md and plots")
	fl.IntVar(&o.Repeats, "repeats", 3, "repeats of every (point, mode) pair")
	fl.DurationVar(&o.Duration, "duration", 0, "length of one measurement (default 2s with --quick, else 10s)")
	fl.StringVar(&topo, "topology", "", "testbed topology lanes builds: docker (the default), flannel or calico")
	fl.StringVar(&o.Overlay, "overlay", "", "have the real daemons build the testbed's overlay: flanneld or dockerd")
	fl.BoolVar(&forwardRules, "flanneld-forward-rules", true, "with --overlay flanneld: let flanneld add its FORWARD accept rules (false: --iptables-forward-rules=false, as where the host's FORWARD policy accepts)")
	fl.IntVar(&o.IRQCPU, "irq-cpu", -1, "core polling the receiving underlay NIC (default: the last core)")
	fl.StringVar(&o.NIC, "nic", testbed.NICThreaded, "how the testbed polls each host's underlay NIC on the IRQ core: threaded (a pinned NAPI kthread: each poll's frames reach their sockets before the next poll), softirq (NET_RX softirq, one poll list with the later stages, as most physical NIC drivers poll) or veth (a plain veth pair: each host's receive path starts on its sender's core, no IRQ core lanes can read)")
	fl.BoolVar(&o.SenderApart, "sender-apart", false, "poll the sending host's underlay NIC on another core than the IRQ core, as if it were another machine, its poller at SCHED_FIFO 1 as hardware would take the core (default: both on the IRQ core)")
	fl.BoolVar(&o.BothHosts, "both-hosts", false, "apply each mode to the sending host too, with its own agent, as an operator runs lanes on every node (default: the receiving host only)")
	fl.BoolVar(&o.ServiceApart, "service-apart", false, "run the priority workloads' marked server off the receive core, beside its client and the background's receiver, as PRISM's evaluation gave its servers cores of their own (default: on the receive core)")
	fl.BoolVar(&o.Keep, "keep", false, "leave the testbed up afterwards")
	fl.IntVar(&o.Train, "train", 1, "send paced generator traffic (udp_stress with --rates, the priority workloads' background) in trains of N datagrams back to back at the same average rate, as a NIC that coalesces interrupts delivers them (1: evenly spaced); with --background sockperf, sockperf's --burst N, sent down the sender's stack, so not necessarily back to back on arrival")
	fl.StringVar(&o.Arrivals, "arrivals", "even", "space that paced generator traffic (or its trains) evenly, or at Poisson times (poisson: exponential gaps of the same mean, as the merged traffic of many independent senders arrives)")
	fl.StringVar(&o.Background, "background", bench.BackgroundStress, "what offers the priority workloads' low-priority background: stress (the stress generator's ready-made frames into the sending host's underlay) or sockperf (sockperf's throughput client in the sending container, as PRISM's evaluation did: down the sender's whole stack)")
	fl.StringVar(&o.Awake, "awake", bench.AwakeBoth, "priority workloads with the cores held out of idle states (a zero CPU latency request: idle then means no competing packets, not a sleeping core): both (each point awake and as-is), on or off")
	fl.BoolVar(&o.BPFStats, "bpf-stats", false, "measure lanes' BPF programs over udp_stress with the kernel's run-time statistics: their time and runs per delivered datagram, per program (the statistics add two clock reads to every program run, so every figure of such a run carries them)")
	fl.StringVar(&loads, "loads", "", "the priority workloads' background loads in percent of the receive core, e.g. 0,65,95 (default: each workload's own, prio_latency 0,10,30,50,65,80,95)")
	fl.StringVar(&rates, "rates", "", "also run udp_stress paced at these offered rates, e.g. 300k,600k,900k: delivered against offered, whose peak is the receive capacity short of livelock")
	return cmd
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// newBenchReportCmd renders a kept run again with this build's tables.
func newBenchReportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report DIR",
		Short: "Write report.md and the plots of a finished run again from DIR/results.json",
		Long: `report reads DIR/results.json, written by lanes bench --out DIR, and writes
DIR/report.md and the PNG plots again with this build's tables: nothing is
measured. Notes the run recorded (plotting failures included) are kept.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := filepath.Join(args[0], "results.json")
			f, err := results.Read(path)
			if err != nil {
				return fmt.Errorf("reading %s: %w (give the --out directory of a lanes bench run)", path, err)
			}
			if err := bench.Render(f, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and plots\n", filepath.Join(args[0], "report.md"))
			return nil
		},
	}
}
