package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
)

func init() { register(newAgentCmd) }

// DefaultMetricsAddr is loopback only: metrics describe the host's
// placement and are nobody else's business unless the operator says so.
const DefaultMetricsAddr = "127.0.0.1:9477"

func newAgentCmd() *cobra.Command {
	var (
		o       control.AgentOptions
		apply   control.Options
		sets    []string
		metrics string
	)
	cmd := &cobra.Command{
		Use:   "agent [--netns NAME] [--mode MODE ...] [--metrics-addr ADDR]",
		Short: "Run the applied mode's run-time part (Falcon's balancer) and serve metrics",
		Long: `agent runs what a mode does at run time (Falcon's balancer: sample core load
every interval, move (flow, stage) pairs off busy cores at flowlet boundaries,
fall back to vanilla placement when the whole core set is busy) and serves
Prometheus metrics. Beside it, for every mode but vanilla, it adopts containers
started after the apply and lets go of those removed (docs/containers.md). Run
it as a service next to "lanes apply", or give --mode to apply first. On SIGINT/SIGTERM it puts the static placement back and exits;
the mode stays applied until "lanes reset".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			o.NetNS = apply.NetNS
			o.StateDir = apply.StateDir
			if apply.Mode != "" {
				params, err := ctlModeParams(cmd, sets)
				if err != nil {
					return err
				}
				apply.Params = params
				st, err := control.Apply(apply)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "applied %s to netns %s: %d changes on cores %s\n", st.Mode, ctlNSLabel(st.NetNS), st.Plan.Changes, st.CPUs)
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector())
			o.Metrics = reg
			o.Logf = func(f string, a ...any) {
				fmt.Fprintf(out, time.Now().Format("15:04:05.000")+" "+f+"\n", a...)
			}
			ag, st, err := control.NewAgent(o)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if metrics != "" {
				ln, err := net.Listen("tcp", metrics)
				if err != nil {
					return fmt.Errorf("metrics address %s: %w (pick another with --metrics-addr, or '' for none)", metrics, err)
				}
				srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
				go srv.Serve(ln)
				defer srv.Shutdown(context.Background())
				fmt.Fprintf(out, "metrics on http://%s/metrics\n", ln.Addr())
			}
			fmt.Fprintf(out, "agent for %s on netns %s running; Ctrl-C stops it\n", st.Mode, ctlNSLabel(st.NetNS))
			pubCtx, stopPub := context.WithCancel(ctx)
			published := make(chan struct{})
			go func() {
				defer close(published)
				control.PublishAgentStatus(pubCtx, control.Dir(o.StateDir, o.NetNS), st.Mode, ag)
			}()
			err = ag.Run(ctx)
			stopPub()
			<-published
			if err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			fmt.Fprintln(out, "agent stopped; static placement restored, mode still applied (undo: lanes reset"+ctlNSFlag(st.NetNS)+")")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&apply.Mode, "mode", "", "apply this mode first (else: run the agent of the mode already applied)")
	f.StringVar(&apply.NetNS, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	f.StringVar(&apply.CPUs, "cpus", "", "with --mode: cores the mode may use (default: all online)")
	f.StringVar(&apply.StateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	f.StringVar(&metrics, "metrics-addr", DefaultMetricsAddr, "serve Prometheus metrics here ('' = off)")
	ctlAddModeFlags(f, &sets)
	return cmd
}
