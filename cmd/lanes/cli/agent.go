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

	"github.com/lanesnet/lanes/cmd/lanes/config"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
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
	a := &agentCmd{}
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
			a.out = cmd.OutOrStdout()
			if err := a.checkFlags(cmd); err != nil {
				return err
			}
			// Signals first: a SIGTERM while the mode is being applied
			// ends the agent through its exit path too.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := a.loadConfig(); err != nil {
				return err
			}
			lock, ln, err := a.lockAndListen()
			if err != nil {
				return err
			}
			defer lock.Close()
			if ln != nil {
				defer ln.Close()
			}
			if err := a.ensure(cmd); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return agentExit(a.out, a.onExit, a.o.NetNS, a.o.StateDir, "stopped before the agent ran")
			}
			ag, st, err := a.build()
			if err != nil {
				return err
			}
			return a.serveAndRun(ctx, ag, st, ln)
		},
	}
	f := cmd.Flags()
	f.StringVar(&a.configPath, "config", "", "apply and run what this file says ("+config.DefaultPath+" on a deployed host; example: deploy/lanes.yaml); excludes the other flags")
	f.StringVar(&a.apply.Mode, "mode", "", "apply this mode first (else: run the agent of the mode already applied)")
	f.StringVar(&a.apply.NetNS, "netns", "", "network namespace holding the VXLAN device (default: lanes' own)")
	f.StringVar(&a.apply.CPUs, "cpus", "", "with --mode: cores the mode may use (default: all online)")
	f.StringVar(&a.apply.StateDir, "state-dir", control.DefaultStateDir, "where journals and state live")
	f.StringVar(&a.metrics, "metrics-addr", DefaultMetricsAddr, "serve /metrics, /healthz and /readyz here ('' = off)")
	f.StringVar(&a.onExit, "on-exit", config.OnExitKeep, "on SIGINT/SIGTERM: keep (leave the mode applied) or reset (put every knob back)")
	ctlAddModeFlags(f, &a.sets)
	return cmd
}

// agentCmd is one run of lanes agent: its flags, or its file's settings,
// and what each step leaves for the next.
type agentCmd struct {
	out        io.Writer
	o          control.AgentOptions
	apply      control.Options
	sets       []string
	metrics    string
	onExit     string
	configPath string
	cfg        *config.Config // nil without --config
	// fresh: this start applied the mode (not one picked up).
	fresh bool
	reg   *prometheus.Registry
}

// checkFlags refuses flags that exclude each other.
func (a *agentCmd) checkFlags(cmd *cobra.Command) error {
	if !cmd.Flags().Changed("config") {
		if a.onExit != config.OnExitKeep && a.onExit != config.OnExitReset {
			return fmt.Errorf("--on-exit %q: want keep (leave the mode applied) or reset (put every knob back)", a.onExit)
		}
		return nil
	}
	for _, f := range []string{"mode", "netns", "cpus", "state-dir", "metrics-addr", "on-exit", "set"} {
		if cmd.Flags().Changed(f) {
			return fmt.Errorf("--config and --%s exclude each other: put it in %s", f, a.configPath)
		}
	}
	return noModeFlags(cmd)
}

// loadConfig reads the file, if one is given, in place of the flags.
func (a *agentCmd) loadConfig() error {
	if a.configPath != "" {
		var err error
		if a.cfg, err = config.Load(a.configPath); err != nil {
			return err
		}
		if a.apply, err = a.cfg.Options(); err != nil {
			return err
		}
		a.metrics, a.onExit = a.cfg.Agent.MetricsAddr, a.cfg.Agent.OnExit
	}
	a.o.NetNS = a.apply.NetNS
	a.o.StateDir = a.apply.StateDir
	return nil
}

// lockAndListen takes the target's agent lock, held for the agent's life
// (one agent per target: a second would run a second balancer and
// follower on the same knobs), and then the metrics address (nil: none),
// before anything is applied: a busy port fails the start with nothing
// changed.
func (a *agentCmd) lockAndListen() (*control.AgentLock, net.Listener, error) {
	lock, err := control.LockAgent(a.o.StateDir, a.o.NetNS)
	if err != nil {
		return nil, nil, err
	}
	if a.metrics == "" {
		return lock, nil, nil
	}
	ln, err := net.Listen("tcp", a.metrics)
	if err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("metrics address %s: %w (pick another with --metrics-addr or agent.metrics-addr, or '' for none)", a.metrics, err)
	}
	return lock, ln, nil
}

// ensure applies what the file says (or picks up its earlier apply), or
// the --mode given; without either, the agent runs the mode applied.
func (a *agentCmd) ensure(cmd *cobra.Command) error {
	switch {
	case a.cfg != nil:
		st, picked, err := control.Ensure(a.apply)
		if err != nil {
			return err
		}
		a.o.NetNS, a.fresh = st.NetNS, !picked
		if picked {
			fmt.Fprintf(a.out, "picked up %s on netns %s as applied at %s (%s): nothing applied again\n", st.Mode, ctlNSLabel(st.NetNS), st.Applied.Local().Format(time.DateTime), a.configPath)
		} else {
			fmt.Fprintf(a.out, "applied %s to netns %s from %s: %d changes on cores %s\n", st.Mode, ctlNSLabel(st.NetNS), a.configPath, st.Plan.Changes, st.CPUs)
		}
		if err := setPrioRules(a.out, st.NetNS, a.configPath, a.cfg.Prio); err != nil {
			if !picked {
				return resetAfter(a.out, st.NetNS, a.apply.StateDir, err)
			}
			return err
		}
		ctlPrintCoexistence(a.out, control.Coexistence())
	case a.apply.Mode != "":
		params, err := ctlModeParams(cmd, a.sets)
		if err != nil {
			return err
		}
		a.apply.Params = params
		st, err := control.Apply(a.apply)
		if err != nil {
			return err
		}
		a.o.NetNS, a.fresh = st.NetNS, true
		fmt.Fprintf(a.out, "applied %s to netns %s: %d changes on cores %s\n", st.Mode, ctlNSLabel(st.NetNS), st.Plan.Changes, st.CPUs)
	}
	return nil
}

// build makes the applied mode's agent, with its metrics, heartbeats and
// log, and keeps the process off the NIC's cores.
func (a *agentCmd) build() (plan.Agent, *control.State, error) {
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector())
	a.o.Metrics = a.reg
	a.o.Beats = heartbeat.NewBoard(nil)
	a.o.Logf = func(f string, args ...any) {
		fmt.Fprintf(a.out, time.Now().Format("15:04:05.000")+" "+f+"\n", args...)
	}
	ag, st, err := control.NewAgent(a.o)
	if err != nil {
		// A file whose mode changes nothing (vanilla: lanes off)
		// still gets an agent that serves health until it is
		// stopped, so a service manager does not restart it.
		if a.cfg == nil || st == nil || st.Phase != control.Applied || st.Plan.Changes != 0 || st.Plan.Agent != "" {
			return nil, nil, notStarted(a.out, a.fresh, a.o.NetNS, a.o.StateDir, err)
		}
		ag = idleAgent{st.Mode}
	}
	// The agent's own work (samples, map reads, rediscovery, the Go
	// runtime) stays off the cores that poll the NIC: there it takes
	// turns with the receive path it steers, and delays the very frames
	// it is to speed up (docs/status.md, PRISM).
	if off, err := cpuset.KeepProcessOff(st.IRQCPUs); err != nil {
		fmt.Fprintf(a.out, "agent threads stay on every core: %v\n", err)
	} else if off != nil {
		fmt.Fprintf(a.out, "agent threads on cores %s, off the NIC's cores %s\n", cpuset.FormatList(off), cpuset.FormatList(st.IRQCPUs))
	}
	// The collector runs on normal-policy threads, beside the tasks of
	// the agent's cores, in bursts of milliseconds; a live heap of a few
	// MB, which PRISM-sync's rounds churn every second, would be
	// collected every second or two at Go's default (a 4 MB goal).
	// agentGCPercent collects five times as much garbage a cycle, for a
	// goal of 20 MB; GOGC, where set, decides.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
	}
	return ag, st, nil
}

// serveAndRun serves metrics and health on ln (nil: none), publishes the
// agent's health, and runs it until ctx ends; then it exits as on-exit
// says. A failed agent keeps the mode: a restarted one (systemd's
// Restart=on-failure, a DaemonSet's restart) picks it up.
func (a *agentCmd) serveAndRun(ctx context.Context, ag plan.Agent, st *control.State, ln net.Listener) error {
	dir := control.Dir(a.o.StateDir, a.o.NetNS)
	health := control.NewHealth(dir, st.Mode, a.o.Beats)
	if ln != nil {
		srv := agentServer(a.reg, health)
		go srv.Serve(ln)
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), serverShutdownTimeout)
			defer cancel()
			srv.Shutdown(sctx)
		}()
		fmt.Fprintf(a.out, "metrics on http://%s/metrics, health on /healthz and /readyz\n", ln.Addr())
	}
	fmt.Fprintf(a.out, "agent for %s on netns %s running (on exit: %s); Ctrl-C stops it\n", st.Mode, ctlNSLabel(st.NetNS), a.onExit)
	pubCtx, stopPub := context.WithCancel(ctx)
	published := make(chan struct{})
	go func() {
		defer close(published)
		control.PublishAgentHealth(pubCtx, dir, st.Mode, ag, health)
	}()
	err := ag.Run(ctx)
	stopPub()
	<-published
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return agentExit(a.out, a.onExit, st.NetNS, a.o.StateDir, "agent stopped; static placement restored")
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
