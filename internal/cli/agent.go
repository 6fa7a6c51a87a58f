package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/internal/config"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
)

func init() { register(newAgentCmd) }

// DefaultMetricsAddr is loopback only: metrics describe the host's
// placement and are nobody else's business unless the operator says so.
const DefaultMetricsAddr = config.DefaultMetricsAddr

// Server timeouts of the agent's HTTP server: a scraper or probe that
// stalls holds a connection this long at most, and a stopping agent waits
// this long at most for requests under way.
const (
	serverReadTimeout     = 10 * time.Second
	serverWriteTimeout    = 30 * time.Second
	serverIdleTimeout     = 60 * time.Second
	serverShutdownTimeout = 5 * time.Second
)

// agentGCPercent is the agent's GOGC unless the environment sets one.
const agentGCPercent = 500

func newAgentCmd() *cobra.Command {
	var (
		o          control.AgentOptions
		apply      control.Options
		sets       []string
		metrics    string
		onExit     string
		configPath string
	)
	cmd := &cobra.Command{
		Use:   "agent [--config FILE | [--netns NAME] [--mode MODE ...] [--metrics-addr ADDR] [--on-exit keep|reset]]",
		Short: "Run the applied mode's run-time part (Falcon's balancer), serve metrics and health",
		Long: `agent runs what a mode does at run time (Falcon's balancer: sample core load
every interval, move (flow, stage) pairs off busy cores at flowlet boundaries,
fall back to vanilla placement when the whole core set is busy) and serves
Prometheus metrics (/metrics) and health (/healthz: its loops are alive;
/readyz: the mode is applied and its programs attached). Beside it, for every
mode but vanilla, it adopts containers started after the apply and lets go of
those removed (docs/containers.md).

With --config FILE (default file ` + config.DefaultPath + `, docs/deploy.md) it
applies what the file says first, unless a previous agent's apply of the same
file is still in place, which it picks up as it is: a restarted agent never
stacks a second copy. On SIGINT/SIGTERM it puts the static placement back,
then, with on-exit: reset (the file's default), every knob lanes changed, as
tuned rolls a profile back; with on-exit: keep the mode stays applied.

Without --config it runs the agent of the mode applied (or of --mode, applied
first); on-exit is keep unless --on-exit says reset.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if cmd.Flags().Changed("config") {
				for _, f := range []string{"mode", "netns", "cpus", "state-dir", "metrics-addr", "on-exit", "set"} {
					if cmd.Flags().Changed(f) {
						return fmt.Errorf("--config and --%s exclude each other: put it in %s", f, configPath)
					}
				}
				if err := noModeFlags(cmd); err != nil {
					return err
				}
			} else if onExit != config.OnExitKeep && onExit != config.OnExitReset {
				return fmt.Errorf("--on-exit %q: want keep (leave the mode applied) or reset (put every knob back)", onExit)
			}
			// Signals first: a SIGTERM while the mode is being applied
			// ends the agent through its exit path too.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()

			var cfg *config.Config
			if configPath != "" {
				var err error
				if cfg, err = config.Load(configPath); err != nil {
					return err
				}
				if apply, err = cfg.Options(); err != nil {
					return err
				}
				metrics, onExit = cfg.Agent.MetricsAddr, cfg.Agent.OnExit
			}
			o.NetNS = apply.NetNS
			o.StateDir = apply.StateDir

			// One agent per target: a second would run a second balancer
			// and follower on the same knobs. Held for the agent's life.
			lock, err := control.LockAgent(o.StateDir, o.NetNS)
			if err != nil {
				return err
			}
			defer lock.Close()

			// The address is taken before anything is applied: a busy
			// port fails the start with nothing changed.
			var ln net.Listener
			if metrics != "" {
				var err error
				if ln, err = net.Listen("tcp", metrics); err != nil {
					return fmt.Errorf("metrics address %s: %w (pick another with --metrics-addr or agent.metrics-addr, or '' for none)", metrics, err)
				}
				defer ln.Close()
			}

			// fresh: this start applied the mode (not one picked up).
			fresh := false
			switch {
			case cfg != nil:
				st, picked, err := control.Ensure(apply)
				if err != nil {
					return err
				}
				o.NetNS, fresh = st.NetNS, !picked
				if picked {
					fmt.Fprintf(out, "picked up %s on netns %s as applied at %s (%s): nothing applied again\n", st.Mode, ctlNSLabel(st.NetNS), st.Applied.Local().Format(time.DateTime), configPath)
				} else {
					fmt.Fprintf(out, "applied %s to netns %s from %s: %d changes on cores %s\n", st.Mode, ctlNSLabel(st.NetNS), configPath, st.Plan.Changes, st.CPUs)
				}
				if err := setPrioRules(out, st.NetNS, configPath, cfg.Prio); err != nil {
					if !picked {
						return resetAfter(out, st.NetNS, apply.StateDir, err)
					}
					return err
				}
				ctlPrintCoexistence(out, control.Coexistence())
			case apply.Mode != "":
				params, err := ctlModeParams(cmd, sets)
				if err != nil {
					return err
				}
				apply.Params = params
				st, err := control.Apply(apply)
				if err != nil {
					return err
				}
				o.NetNS, fresh = st.NetNS, true
				fmt.Fprintf(out, "applied %s to netns %s: %d changes on cores %s\n", st.Mode, ctlNSLabel(st.NetNS), st.Plan.Changes, st.CPUs)
			}
			if ctx.Err() != nil {
				return agentExit(out, onExit, o.NetNS, o.StateDir, "stopped before the agent ran")
			}

			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector())
			o.Metrics = reg
			o.Beats = heartbeat.NewBoard(nil)
			o.Logf = func(f string, a ...any) {
				fmt.Fprintf(out, time.Now().Format("15:04:05.000")+" "+f+"\n", a...)
			}
			ag, st, err := control.NewAgent(o)
			if err != nil {
				// A file whose mode changes nothing (vanilla: lanes off)
				// still gets an agent that serves health until it is
				// stopped, so a service manager does not restart it.
				if cfg == nil || st == nil || st.Phase != control.Applied || st.Plan.Changes != 0 || st.Plan.Agent != "" {
					return notStarted(out, fresh, o.NetNS, o.StateDir, err)
				}
				ag = idleAgent{st.Mode}
			}
			// The agent's own work (samples, map reads, rediscovery, the
			// Go runtime) stays off the cores that poll the NIC: there it
			// takes turns with the receive path it steers, and delays
			// the very frames it is to speed up (docs/status.md, PRISM).
			if off, err := cpuset.KeepProcessOff(st.IRQCPUs); err != nil {
				fmt.Fprintf(out, "agent threads stay on every core: %v\n", err)
			} else if off != nil {
				fmt.Fprintf(out, "agent threads on cores %s, off the NIC's cores %s\n", cpuset.FormatList(off), cpuset.FormatList(st.IRQCPUs))
			}
			// The collector runs on normal-policy threads, beside the
			// tasks of the agent's cores, in bursts of milliseconds; a
			// live heap of a few MB, which PRISM-sync's rounds churn
			// every second, would be collected every second or two at
			// Go's default (a 4 MB goal). agentGCPercent collects five
			// times as much garbage a cycle, for a goal of 20 MB; GOGC,
			// where set, decides.
			if os.Getenv("GOGC") == "" {
				debug.SetGCPercent(agentGCPercent)
			}
			dir := control.Dir(o.StateDir, o.NetNS)
			health := control.NewHealth(dir, st.Mode, o.Beats)
			if ln != nil {
				srv := agentServer(reg, health)
				go srv.Serve(ln)
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), serverShutdownTimeout)
					defer cancel()
					srv.Shutdown(sctx)
				}()
				fmt.Fprintf(out, "metrics on http://%s/metrics, health on /healthz and /readyz\n", ln.Addr())
			}
			fmt.Fprintf(out, "agent for %s on netns %s running (on exit: %s); Ctrl-C stops it\n", st.Mode, ctlNSLabel(st.NetNS), onExit)
			pubCtx, stopPub := context.WithCancel(ctx)
			published := make(chan struct{})
			go func() {
				defer close(published)
				control.PublishAgentHealth(pubCtx, dir, st.Mode, ag, health)
			}()
			err = ag.Run(ctx)
			stopPub()
			<-published
			if err != nil && !errors.Is(err, context.Canceled) {
				// A failed agent keeps the mode: a restarted one (systemd's
				// Restart=on-failure, a DaemonSet's restart) picks it up.
				return err
			}
			return agentExit(out, onExit, st.NetNS, o.StateDir, "agent stopped; static placement restored")
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "apply and run what this file says ("+config.DefaultPath+" on a deployed host; example: deploy/lanes.yaml); excludes the other flags")
	f.StringVar(&apply.Mode, "mode", "", "apply this mode first (else: run the agent of the mode already applied)")
	f.StringVar(&apply.NetNS, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	f.StringVar(&apply.CPUs, "cpus", "", "with --mode: cores the mode may use (default: all online)")
	f.StringVar(&apply.StateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	f.StringVar(&metrics, "metrics-addr", DefaultMetricsAddr, "serve /metrics, /healthz and /readyz here ('' = off)")
	f.StringVar(&onExit, "on-exit", config.OnExitKeep, "on SIGINT/SIGTERM: keep (leave the mode applied) or reset (put every knob back)")
	ctlAddModeFlags(f, &sets)
	return cmd
}

// agentServer serves the agent's metrics and health, with timeouts so
// that no client holds it.
func agentServer(reg *prometheus.Registry, h *control.Health) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", h.ServeHealthz)
	mux.HandleFunc("/readyz", h.ServeReadyz)
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       serverReadTimeout,
		WriteTimeout:      serverWriteTimeout,
		IdleTimeout:       serverIdleTimeout,
	}
}

// agentExit ends an agent: with on-exit reset it puts every knob back.
func agentExit(out io.Writer, onExit, netns, stateDir, what string) error {
	if onExit != config.OnExitReset {
		fmt.Fprintf(out, "%s, mode still applied (undo: lanes reset%s)\n", what, ctlNSFlag(netns))
		return nil
	}
	res, err := control.Reset(netns, stateDir)
	fmt.Fprintf(out, "%s; on exit: reset\n", what)
	if res != nil {
		ctlPrintReset(out, res)
	}
	return err
}

// resetAfter undoes an apply whose later part (its priority rules) failed,
// so that nothing of a file is left half applied.
func resetAfter(out io.Writer, netns, stateDir string, cause error) error {
	if _, err := control.Reset(netns, stateDir); err != nil {
		return fmt.Errorf("%w; resetting the mode failed too: %v (run lanes reset%s)", cause, err, ctlNSFlag(netns))
	}
	return fmt.Errorf("%w (the mode was reset: nothing of this start is left applied)", cause)
}

// notStarted ends an agent that could not be built. Where this start
// applied the mode, it is reset: nothing is left applied with nothing
// running it. Where its settings are the cause (plan.ConfigError), a
// service manager would restart the agent into the same failure for good
// (each start applying it again): the exit status is then
// config.ExitConfig, on which the systemd unit does not restart, since
// another file or mode is what mends it. Any other cause (a busy journal,
// a device that went away) is an ordinary failure, for a restart to try
// again. An apply picked up stays.
func notStarted(out io.Writer, fresh bool, netns, stateDir string, err error) error {
	if !fresh {
		return err
	}
	err = resetAfter(out, netns, stateDir, fmt.Errorf("the agent cannot run the mode this start applied: %w", err))
	if plan.IsConfigError(err) {
		return exitConfig{err}
	}
	return err
}

// exitConfig is an error that makes lanes exit with config.ExitConfig.
type exitConfig struct{ error }

func (e exitConfig) Unwrap() error { return e.error }
func (e exitConfig) ExitCode() int { return config.ExitConfig }

// idleAgent is the agent of a mode that changes nothing: it waits.
type idleAgent struct{ mode string }

func (a idleAgent) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (a idleAgent) Status() any { return idleStatus{a.mode + " changes nothing: nothing to run"} }

type idleStatus struct {
	Agent string `json:"agent"`
}

func (s idleStatus) Summary() []string { return []string{s.Agent} }
