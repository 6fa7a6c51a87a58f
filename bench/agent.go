package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
)

// benchAgent is the agent of the mode being measured. The lanes binary
// runs it as its own `lanes agent` process (procAgent), where an operator
// runs it: its threads then keep off the NIC's cores as lanes agent's do,
// and what it costs the receive path is what it costs on a host. Tests,
// whose binary is not lanes, run it inside the benchmark (inAgent).
type benchAgent interface {
	// status is the agent's Status as JSON, as `lanes status --json`
	// shows it, taken at or after since where the agent publishes it
	// once a round (a zero since: the latest).
	status(since time.Time) []byte
	stop()
}

// inAgent runs an agent in the benchmark's own process.
type inAgent struct {
	ag     plan.Agent
	cancel func()
	done   chan struct{}
}

func startInAgent(netns, stateDir string, logf func(string, ...any)) (*inAgent, error) {
	ag, _, err := control.NewAgent(control.AgentOptions{NetNS: netns, StateDir: stateDir, Logf: logf})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &inAgent{ag: ag, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(a.done); ag.Run(ctx) }()
	return a, nil
}

func (a *inAgent) status(time.Time) []byte {
	b, err := json.Marshal(a.ag.Status())
	if err != nil {
		return nil
	}
	return b
}

func (a *inAgent) stop() { a.cancel(); <-a.done }

// procAgent is `lanes agent` in a process of its own, on the mode the
// benchmark applied (--on-exit keep: the benchmark resets it).
type procAgent struct {
	proc *os.Process
	dir  string // where it publishes its report (control.AgentFile)
	done chan struct{}
	err  error // its exit, once done is closed
	out  *agentOutput
}

// Bounds of a process agent's life as the benchmark sees it: how long it
// may take to publish its first report, to publish one after a given
// time, and to end on SIGTERM (restoring the static placement) before it
// is killed.
const (
	agentStartWait = 20 * time.Second
	agentFreshWait = 3 * control.AgentPublishEvery
	agentStopWait  = 15 * time.Second
)

// startProcAgent starts bin as `lanes agent` on netns and waits for its
// first report. Its output goes to out, a line at a time.
func startProcAgent(bin, netns, stateDir string, out *agentOutput) (*procAgent, error) {
	cmd := &exec.Cmd{
		Path:   bin,
		Args:   []string{"lanes", "agent", "--netns", netns, "--state-dir", stateDir, "--metrics-addr", "", "--on-exit", "keep"},
		Stdout: out,
		Stderr: out,
		// An agent outlives no benchmark: were the benchmark killed,
		// the kernel ends its agent, which puts the static placement
		// back on its way out.
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM},
	}
	a := &procAgent{dir: control.Dir(stateDir, netns), done: make(chan struct{}), out: out}
	started := make(chan error, 1)
	go func() {
		defer close(a.done)
		// Pdeathsig fires when the thread that started the child ends,
		// not the process: this goroutine holds its thread until the
		// child is gone, so that happens only with the benchmark.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		a.err = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting lanes agent: %w", err)
	}
	a.proc = cmd.Process
	if a.report(time.Time{}, agentStartWait) == nil {
		select {
		case <-a.done:
			return nil, fmt.Errorf("lanes agent ended before it ran (%v): %s", a.err, out.tail())
		default:
			a.stop()
			return nil, fmt.Errorf("lanes agent published no report in %s: %s", agentStartWait, out.tail())
		}
	}
	return a, nil
}

func (a *procAgent) status(since time.Time) []byte {
	if r := a.report(since, agentFreshWait); r != nil {
		return r.Status
	}
	return nil
}

// report waits up to wait for a report this agent published at or after
// since (nil: none came, or the agent ended).
func (a *procAgent) report(since time.Time, wait time.Duration) *control.AgentReport {
	deadline := time.Now().Add(wait)
	for {
		r, err := control.ReadAgentReport(a.dir)
		if err == nil && r != nil && r.PID == a.proc.Pid && r.Running && !r.At.Before(since) {
			return r
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-a.done:
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (a *procAgent) stop() {
	a.proc.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(agentStopWait):
		a.proc.Kill()
		<-a.done
	}
	if a.err != nil {
		fmt.Fprintf(a.out, "lanes agent (pid %d) ended: %v\n", a.proc.Pid, a.err)
	}
}

// agentOutput writes a process agent's output lines into the agent log,
// each stamped as the benchmark's own lines are, and keeps the last few
// for an error that has to say why the agent did not start.
type agentOutput struct {
	log     *syncWriter
	mode    string
	partial []byte
	last    []string
}

func (o *agentOutput) Write(p []byte) (int, error) {
	o.partial = append(o.partial, p...)
	for {
		i := bytes.IndexByte(o.partial, '\n')
		if i < 0 {
			break
		}
		line := string(o.partial[:i])
		o.partial = o.partial[i+1:]
		// lanes agent stamps its decisions with the time of day; the
		// log's own stamp says it.
		if len(line) > 13 && agentStamp.MatchString(line[:13]) {
			line = line[13:]
		}
		fmt.Fprintf(o.log, "%s %s: agent: %s\n", time.Now().UTC().Format("15:04:05.000"), o.mode, line)
		if o.last = append(o.last, line); len(o.last) > 4 {
			o.last = o.last[1:]
		}
	}
	return len(p), nil
}

func (o *agentOutput) tail() string {
	if len(o.last) == 0 {
		return "no output"
	}
	return strings.Join(o.last, "; ")
}

// agentStamp is lanes agent's own time of day on a log line.
var agentStamp = regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d\d\d $`)

// syncWriter lets the benchmark and a process agent's output write the
// agent log at once, a whole line per Write.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
