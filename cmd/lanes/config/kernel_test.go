package config_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lanesnet/lanes/cmd/lanes/cli"
	"github.com/lanesnet/lanes/cmd/lanes/config"
	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/testbed"
	"github.com/lanesnet/lanes/topology"
)

// lanesArgsEnv makes the test binary run lanes with these arguments
// (separated by 0x1f: an environment variable holds no NUL) instead of
// the tests: the agent the restart test kills.
const lanesArgsEnv = "LANES_CONFIG_TEST_LANES_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(lanesArgsEnv); args != "" {
		// The test mode is the children's alone: the tests' own lists
		// of modes do not have it.
		registerAgentFail()
		// As the binary runs: its exit status is the error's.
		os.Args = append(os.Args[:1], strings.Split(args, "\x1f")...)
		cli.Execute()
		os.Exit(0)
	}
	modetest.Main(m, "tcf")
}

// lanes runs a lanes command in this process.
func lanes(args ...string) (string, error) {
	var out strings.Builder
	root := cli.NewRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lanes.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// lanes apply --config applies the file's mode, settings and priority
// rules to the testbed's receiver; a bad file applies nothing; reset
// puts every knob back.
func TestApplyFromConfig(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	modetest.Online(t)
	ns := tb.Receiver().NetNS
	stateDir := t.TempDir()
	before := modetest.Snapshot(t, tb)
	t.Cleanup(func() { control.Reset(ns, stateDir) })
	addr := tb.Receiver().Containers[0].Addr.Addr()

	bad := writeFile(t, fmt.Sprintf("netns: %s\nmode: prism\nsettings:\n  prio-mode: batch\n  rt: 100\nprio:\n  - dst %s udp\nstate-dir: %s\n", ns, addr, stateDir))
	_, err := lanes("apply", "--config", bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+":5: bad prism setting rt=\"100\"") {
		t.Errorf("bad file: %v", err)
	}
	modetest.SameSnapshot(t, "after a refused file", modetest.Snapshot(t, tb), before)
	modetest.NoState(t, stateDir)

	good := writeFile(t, fmt.Sprintf("netns: %s\nmode: prism\nsettings:\n  prio-mode: batch\nprio:\n  - dst %s udp\nstate-dir: %s\n", ns, addr, stateDir))
	out, err := lanes("apply", "--config", good)
	if err != nil {
		t.Fatalf("apply --config: %v\n%s", err, out)
	}
	if !strings.Contains(out, "applied prism to netns "+ns) || !strings.Contains(out, "high priority: dst "+addr.String()+" udp") || !strings.Contains(out, "lanes agent --config "+good) {
		t.Errorf("apply --config said:\n%s", out)
	}
	st, err := control.ReadState(control.Dir(stateDir, ns))
	if err != nil || st == nil || st.Phase != control.Applied || st.Mode != "prism" || st.Params["prio-mode"] != "batch" {
		t.Fatalf("state %+v, %v", st, err)
	}
	set := modetest.Prio(t, ns)
	rules, err := set.List()
	if err != nil || len(rules) != 1 || rules[0] != modetest.Rule(t, "dst "+addr.String()+" udp") {
		t.Errorf("rules %v, %v", rules, err)
	}
	set.Close()

	if out, err := lanes("reset", "--netns", ns, "--state-dir", stateDir); err != nil {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	modetest.SameSnapshot(t, "after reset", modetest.Snapshot(t, tb), before)
	modetest.NoState(t, stateDir)
}

// agentProc is a lanes agent --config running in a child process.
type agentProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	addr chan string
	done chan error
}

func startAgent(t *testing.T, path string) *agentProc {
	t.Helper()
	return startLanes(t, "agent", "--config", path)
}

// startLanes runs lanes with args in a child process.
func startLanes(t *testing.T, args ...string) *agentProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProc{addr: make(chan string, 1), done: make(chan error, 1)}
	a.cmd = exec.Command(self)
	a.cmd.Env = append(os.Environ(), lanesArgsEnv+"="+strings.Join(args, "\x1f"))
	pr, pw := io.Pipe()
	a.cmd.Stdout, a.cmd.Stderr = pw, pw
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			l := sc.Text()
			a.mu.Lock()
			a.out.WriteString(l + "\n")
			a.mu.Unlock()
			if rest, ok := strings.CutPrefix(l, "metrics on http://"); ok {
				a.addr <- strings.TrimSuffix(strings.Fields(rest)[0], ",")
			}
		}
	}()
	go func() {
		err := a.cmd.Wait()
		pw.Close()
		a.done <- err
	}()
	t.Cleanup(func() {
		if a.cmd.ProcessState == nil {
			a.cmd.Process.Kill()
			<-a.done
		}
	})
	return a
}

func (a *agentProc) output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.out.String()
}

// base waits for the agent's server and returns its URL.
func (a *agentProc) base(t *testing.T) string {
	t.Helper()
	select {
	case addr := <-a.addr:
		return "http://" + strings.TrimSuffix(addr, "/metrics")
	case err := <-a.done:
		t.Fatalf("agent exited: %v\n%s", err, a.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("agent's server not up after 60 s:\n%s", a.output())
	}
	return ""
}

// get returns an endpoint's status code and JSON body.
func get(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	var body map[string]any
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var code int
		if code, body = get(t, base+"/readyz"); code == 200 {
			return
		}
	}
	t.Fatalf("/readyz never 200: %v", body)
}

// programs is the XDP and tcx part of a snapshot: the program ids per
// device and hook.
func programs(snap map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range snap {
		if strings.HasPrefix(k, "xdp:") || strings.HasPrefix(k, "tcx:") {
			out[k] = v
		}
	}
	return out
}

// A lanes agent --config killed with SIGKILL leaves its apply in place;
// lanes status fails for it; the restarted agent picks the journal up and
// attaches nothing again (one program per hook, the same ones, one
// journal); a third beside it is refused; /healthz and /readyz answer;
// SIGTERM resets (on-exit's
// default) and the testbed is as before.
func TestAgentRestartPicksUp(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	modetest.Online(t)
	ns := tb.Receiver().NetNS
	stateDir := t.TempDir()
	before := modetest.Snapshot(t, tb)
	t.Cleanup(func() { control.Reset(ns, stateDir) })
	path := writeFile(t, fmt.Sprintf("netns: %s\nmode: prism\nprio:\n  - dst %s udp\nagent:\n  metrics-addr: 127.0.0.1:0\nstate-dir: %s\n",
		ns, tb.Receiver().Containers[0].Addr.Addr(), stateDir))

	first := startAgent(t, path)
	base := first.base(t)
	waitReady(t, base)
	if !strings.Contains(first.output(), "applied prism to netns "+ns) {
		t.Errorf("first agent:\n%s", first.output())
	}
	applied := modetest.Snapshot(t, tb)
	progs := programs(applied)
	xdp := progs["xdp:"+ns+":"+tb.Receiver().Underlay]
	if xdp == "0" || xdp == "" {
		t.Fatalf("no XDP program on the receiver's underlay: %v", progs)
	}
	for k, v := range progs {
		if strings.Contains(v, ",") {
			t.Errorf("%s: programs %s, want one at most", k, v)
		}
	}
	journal := filepath.Join(control.Dir(stateDir, ns), "journal.json")
	j1, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}

	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done
	out, err := lanes("status", "--netns", ns, "--state-dir", stateDir, "--sample", "50ms")
	if err == nil || !strings.Contains(err.Error(), "is not running") {
		t.Errorf("status with the agent killed: %v\n%s", err, out)
	}

	second := startAgent(t, path)
	base = second.base(t)
	waitReady(t, base)
	if !strings.Contains(second.output(), "picked up prism on netns "+ns) {
		t.Errorf("second agent applied again:\n%s", second.output())
	}
	modetest.SameSnapshot(t, "programs after the restart", programs(modetest.Snapshot(t, tb)), progs)
	if j2, err := os.ReadFile(journal); err != nil || string(j2) != string(j1) {
		t.Errorf("journal changed across the restart (%v)", err)
	}
	if ents, _ := os.ReadDir(stateDir); len(ents) != 1 {
		t.Errorf("state dir holds %d targets, want one", len(ents))
	}
	code, body := get(t, base+"/healthz")
	if code != 200 || body["ok"] != true {
		t.Errorf("/healthz: %d %v", code, body)
	}
	// Every loop of the agent beats: the mode's own (the guard's, which
	// runs high=auto), the follower's, the reconciler's.
	var loops []string
	for _, l := range body["loops"].([]any) {
		loops = append(loops, l.(map[string]any)["name"].(string))
	}
	slices.Sort(loops)
	if want := []string{"container follower", "prism guard", "queue reconciler"}; !slices.Equal(loops, want) {
		t.Errorf("/healthz loops %q, want %q", loops, want)
	}
	code, body = get(t, base+"/readyz")
	if code != 200 || body["mode"] != "prism" || body["programs"].(float64) < 2 || body["programs"] != body["attached"] {
		t.Errorf("/readyz: %d %v", code, body)
	}
	if out, err := lanes("status", "--netns", ns, "--state-dir", stateDir, "--sample", "50ms"); err != nil {
		t.Errorf("status with the agent running: %v\n%s", err, out)
	}
	if _, err := lanes("agent", "--config", path); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Errorf("a second agent beside the running one: %v", err)
	}

	second.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-second.done:
		if err != nil {
			t.Errorf("agent on SIGTERM: %v\n%s", err, second.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent still running 30 s after SIGTERM:\n%s", second.output())
	}
	if !strings.Contains(second.output(), "on exit: reset") {
		t.Errorf("agent on SIGTERM said:\n%s", second.output())
	}
	modetest.SameSnapshot(t, "after the agent's reset", modetest.Snapshot(t, tb), before)
	modetest.NoState(t, stateDir)
}

// vanillaFile is a file applying vanilla to a testbed's receiver, its
// agent on a port of its own and keeping the state on exit; reset when
// the test ends.
func vanillaFile(t *testing.T) (ns, stateDir, path string) {
	t.Helper()
	tb := modetest.UpTestbed(t, testbed.Docker)
	ns, stateDir = tb.Receiver().NetNS, t.TempDir()
	t.Cleanup(func() { control.Reset(ns, stateDir) })
	path = writeFile(t, fmt.Sprintf("netns: %s\nmode: vanilla\nagent:\n  metrics-addr: 127.0.0.1:0\n  on-exit: keep\nstate-dir: %s\n", ns, stateDir))
	return ns, stateDir, path
}

// A file whose mode changes nothing (vanilla) still runs an agent that
// serves health until SIGTERM, with on-exit keep leaving the state.
func TestAgentVanilla(t *testing.T) {
	ns, stateDir, path := vanillaFile(t)
	a := startAgent(t, path)
	base := a.base(t)
	waitReady(t, base)
	if code, body := get(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d %v", code, body)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-a.done; err != nil {
		t.Errorf("agent on SIGTERM: %v\n%s", err, a.output())
	}
	if !strings.Contains(a.output(), "mode still applied") {
		t.Errorf("on-exit keep:\n%s", a.output())
	}
	if st, _ := control.ReadState(control.Dir(stateDir, ns)); st == nil || st.Mode != "vanilla" {
		t.Errorf("state after on-exit keep: %+v", st)
	}
}

// waitRunning waits until each agent either runs (said so) or exited, and
// returns those that run.
func waitRunning(t *testing.T, agents ...*agentProc) (running []*agentProc, exited []*agentProc) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, a := range agents {
		for {
			if strings.Contains(a.output(), " running (on exit: ") {
				running = append(running, a)
				break
			}
			select {
			case err := <-a.done:
				a.done <- err
				exited = append(exited, a)
			case <-time.After(50 * time.Millisecond):
				if time.Now().After(deadline) {
					t.Fatalf("agent neither running nor gone after 60 s:\n%s", a.output())
				}
				continue
			}
			break
		}
	}
	return running, exited
}

// Two agents of one file started at once: exactly one runs, the other is
// refused naming it, whichever took the lock first.
func TestTwoAgentsAtOnce(t *testing.T) {
	_, _, path := vanillaFile(t)
	a, b := startAgent(t, path), startAgent(t, path)
	running, exited := waitRunning(t, a, b)
	if len(running) != 1 || len(exited) != 1 {
		t.Fatalf("%d agents run, %d exited; want one each:\n%s\n---\n%s", len(running), len(exited), a.output(), b.output())
	}
	win, lose := running[0], exited[0]
	if want := fmt.Sprintf("an agent (pid %d) already runs", win.cmd.Process.Pid); !strings.Contains(lose.output(), want) {
		t.Errorf("the refused agent said:\n%s\nwant %q", lose.output(), want)
	}
	win.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-win.done; err != nil {
		t.Errorf("agent on SIGTERM: %v\n%s", err, win.output())
	}
}

// The file's priority rules are the applied mode's set: an agent that
// picks up an apply whose rules were {A, B} with a file that lists {A}
// removes B from the datapath and says so.
func TestAgentRulesAreTheFile(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	ns := tb.Receiver().NetNS
	stateDir := t.TempDir()
	t.Cleanup(func() { control.Reset(ns, stateDir) })
	addr := tb.Receiver().Containers[0].Addr.Addr()
	a, b := "dst "+addr.String()+" udp", "dst "+addr.String()+" port 80 tcp"
	file := func(rules ...string) string {
		return fmt.Sprintf("netns: %s\nmode: prism\nprio:\n  - %s\nagent:\n  metrics-addr: 127.0.0.1:0\n  on-exit: keep\nstate-dir: %s\n", ns, strings.Join(rules, "\n  - "), stateDir)
	}
	rules := func() []string {
		set := modetest.Prio(t, ns)
		defer set.Close()
		rs, err := set.List()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.String())
		}
		return out
	}
	run := func(path string) string {
		ag := startAgent(t, path)
		waitReady(t, ag.base(t))
		ag.cmd.Process.Signal(syscall.SIGTERM)
		if err := <-ag.done; err != nil {
			t.Fatalf("agent on SIGTERM: %v\n%s", err, ag.output())
		}
		return ag.output()
	}
	path := writeFile(t, file(a, b))
	run(path)
	if got := rules(); len(got) != 2 {
		t.Fatalf("premise: the first agent's rules are %q, want %q and %q", got, a, b)
	}
	if err := os.WriteFile(path, []byte(file(a)), 0o644); err != nil {
		t.Fatal(err)
	}
	out := run(path)
	if !strings.Contains(out, "picked up prism") {
		t.Fatalf("premise: the second agent picks the apply up:\n%s", out)
	}
	if got := rules(); len(got) != 1 || got[0] != a {
		t.Errorf("rules after the restart: %q, want only %q", got, a)
	}
	if want := "high priority: removed " + b + " (not in " + path + ")"; !strings.Contains(out, want) {
		t.Errorf("the agent did not say %q:\n%s", want, out)
	}
}

// agentFailMode is a mode whose plan changes one knob and whose agent
// never starts: what an agent meets that cannot run the mode it applied.
type agentFailMode struct{}

const agentFailName = "x-test-agentfail"

func (agentFailMode) Mode() string    { return agentFailName }
func (agentFailMode) Summary() string { return "test: a mode whose agent cannot start" }
func (agentFailMode) Plan(t *topology.Topology, _ plan.Config) (*plan.Plan, error) {
	p := &plan.Plan{Mode: agentFailName, Agent: agentFailName}
	p.Add(knobs.Sysctl(t.NetNS, "net.core.somaxconn"), "1111", "somaxconn", "a knob for the reset to put back")
	return p, nil
}

// agentFailBusyEnv, set to 1, makes the test mode's agent fail as a
// start may that a restart mends (a busy journal), not for its settings.
const agentFailBusyEnv = "LANES_TEST_AGENT_FAIL_BUSY"

func registerAgentFail() {
	plan.Register(agentFailMode{})
	plan.RegisterAgent(agentFailName, func(plan.AgentEnv) (plan.Agent, error) {
		if os.Getenv(agentFailBusyEnv) == "1" {
			return nil, fmt.Errorf("this test's agent finds the journal %w", knobs.ErrBusy)
		}
		return nil, plan.ConfigError{Err: errors.New("this test's agent never starts")}
	})
}

// An agent that cannot start the mode its own start applied resets it.
// Where its settings are the cause it exits with ExitConfig, on which the
// systemd unit does not restart; where the cause may pass (a busy
// journal) it exits 1, for the unit to restart it. One that picked up an
// earlier apply leaves it and exits 1, for a restart to try again.
func TestAgentStartFailsWhole(t *testing.T) {
	tb := modetest.UpTestbed(t, testbed.Docker)
	ns := tb.Receiver().NetNS
	stateDir := t.TempDir()
	t.Cleanup(func() { control.Reset(ns, stateDir) })
	knob := knobs.Sysctl(ns, "net.core.somaxconn")
	before, err := knob.Read()
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, fmt.Sprintf("netns: %s\nmode: %s\nagent:\n  metrics-addr: \"\"\nstate-dir: %s\n", ns, agentFailName, stateDir))
	exit := func(a *agentProc) int {
		t.Helper()
		select {
		case <-a.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("agent still running after 60 s:\n%s", a.output())
		}
		return a.cmd.ProcessState.ExitCode()
	}

	// failsWhole starts the agent, which applies the mode and fails
	// (saying why), and checks it exits with code, the mode reset.
	failsWhole := func(code int, why string) {
		t.Helper()
		a := startAgent(t, path)
		if got := exit(a); got != code {
			t.Errorf("exit status %d after its own apply, failing with %q, want %d:\n%s", got, why, code, a.output())
		}
		if !strings.Contains(a.output(), "applied "+agentFailName) {
			t.Fatalf("premise: the agent applied the mode:\n%s", a.output())
		}
		if !strings.Contains(a.output(), why) || !strings.Contains(a.output(), "the mode was reset") {
			t.Errorf("the agent did not say why and what it did:\n%s", a.output())
		}
		if v, err := knob.Read(); err != nil || string(v) != string(before) {
			t.Errorf("somaxconn %q after the agent, %q before (%v)", v, before, err)
		}
		modetest.NoState(t, stateDir)
	}

	failsWhole(config.ExitConfig, "this test's agent never starts")

	if ap := startLanes(t, "apply", "--config", path); exit(ap) != 0 {
		t.Fatalf("apply --config:\n%s", ap.output())
	}
	b := startAgent(t, path)
	if code := exit(b); code != 1 {
		t.Errorf("exit status %d on a picked-up apply, want 1:\n%s", code, b.output())
	}
	if !strings.Contains(b.output(), "picked up "+agentFailName) {
		t.Fatalf("premise: the agent picked the apply up:\n%s", b.output())
	}
	if st, _ := control.ReadState(control.Dir(stateDir, ns)); st == nil || st.Mode != agentFailName {
		t.Errorf("the picked-up apply did not stay: state %+v", st)
	}

	if _, err := control.Reset(ns, stateDir); err != nil {
		t.Fatal(err)
	}
	t.Setenv(agentFailBusyEnv, "1")
	failsWhole(1, "this test's agent finds the journal busy")
}
