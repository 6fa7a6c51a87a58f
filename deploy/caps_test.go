package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/testbed"
)

// lanesCaps are the Linux capabilities lanes needs, measured by
// TestCapabilities: every mode applies, runs its agent and resets with
// these alone, and without any one of them something fails. Every list of
// them (the DaemonSets, the systemd unit, the Dockerfile's example,
// docs/deploy.md's table, which says why each) equals this one
// (TestDaemonSet, TestUninstall, TestSystemdUnit, TestCapabilityLists).
var lanesCaps = []string{"NET_ADMIN", "SYS_ADMIN", "SYS_NICE", "SYS_PTRACE"}

// capsWhy is, for each capability, a mode that fails without it, the
// namespace form it fails on ("pid": pid:N) and a piece of its error.
var capsWhy = map[string]struct {
	mode, netns, fails string
}{
	"NET_ADMIN":  {"rps", "", "rps_cpus: operation not permitted"},
	"SYS_ADMIN":  {"rps", "", "entering netns"},
	"SYS_NICE":   {"prism-batch", "", "setting the scheduling policy"},
	"SYS_PTRACE": {"rps", "pid", "lanes needs CAP_SYS_PTRACE"},
}

// The lists of lanesCaps outside the manifests and the unit: the
// Dockerfile's `docker run` example adds exactly them, and docs/deploy.md's
// table names exactly them.
func TestCapabilityLists(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	added := regexp.MustCompile(`--cap-add\s+([A-Z_]+)`).FindAllStringSubmatch(string(b), -1)
	var docker []string
	for _, m := range added {
		docker = append(docker, m[1])
	}
	if !slices.Equal(docker, lanesCaps) || !strings.Contains(string(b), "--cap-drop ALL") {
		t.Errorf("Dockerfile: docker run adds %v, want --cap-drop ALL and exactly %v", docker, lanesCaps)
	}
	b, err = os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	var table []string
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "| capability |"):
			in = true
		case in && strings.HasPrefix(l, "| `"):
			table = append(table, strings.Trim(strings.Fields(l)[1], "`"))
		case in && !strings.HasPrefix(l, "|"):
			in = false
		}
	}
	if !slices.Equal(table, lanesCaps) {
		t.Errorf("docs/deploy.md's capability table names %v, want exactly %v", table, lanesCaps)
	}
}

// buildLanes builds the static binary, as make build does.
func buildLanes(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lanes")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/lanesnet/lanes/cmd/lanes")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the static binary: %v\n%s", err, out)
	}
	return bin
}

// capsAgent runs `lanes agent --config` on mode under a capability
// bounding set of caps alone (setpriv), as the DaemonSet's container or
// the systemd unit runs it; once it runs, SIGTERM makes it reset
// (on-exit: reset). It returns the agent's output and whether it ran and
// exited 0.
func capsAgent(t *testing.T, bin, netns, mode string, caps []string) (string, bool) {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("netns: %s\nmode: %s\nagent:\n  metrics-addr: \"\"\n  on-exit: reset\nstate-dir: %s\n", netns, mode, filepath.Join(dir, "state"))
	if strings.HasPrefix(mode, "prism") {
		cfg += "prio:\n  - dst 198.19.0.21 port 11111 udp\n"
	}
	path := filepath.Join(dir, "lanes.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	bound := "-all"
	for _, c := range caps {
		bound += ",+" + strings.ToLower(c)
	}
	out := filepath.Join(dir, "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("setpriv", "--bounding-set="+bound, "--", bin, "agent", "--config", path)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := func() string { b, _ := os.ReadFile(out); return string(b) }
	ran, killed, err := superviseAgent(cmd, read, 2*time.Minute, stopGrace)
	if killed {
		t.Errorf("mode %s: the agent did not exit within %v of SIGTERM; killed:\n%s", mode, stopGrace, read())
	}
	modetest.NoState(t, filepath.Join(dir, "state"))
	return read(), ran && err == nil
}

// stopGrace is how long an agent has to reset and exit after SIGTERM: the
// DaemonSet's terminationGracePeriodSeconds.
const stopGrace = 30 * time.Second

// superviseAgent waits up to start for the started cmd to say that it
// runs (read returns its output so far), then sends it SIGTERM and waits
// up to stop for it to exit. One that does not say it runs in time, or
// does not exit in time after SIGTERM (killed), is killed. It returns
// whether the agent ran and how it exited.
func superviseAgent(cmd *exec.Cmd, read func() string, start, stop time.Duration) (ran, killed bool, err error) {
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kill := func() error { cmd.Process.Kill(); return <-exited }
	for end := time.Now().Add(start); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-exited:
			return false, false, err
		default:
		}
		if strings.Contains(read(), "running (on exit: reset)") {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				return true, false, err
			case <-time.After(stop):
				return true, true, kill()
			}
		}
	}
	return false, false, kill()
}

// An agent that runs and then ignores SIGTERM (one stuck in its reset)
// is killed after the grace and reported, instead of hanging the test.
func TestSuperviseAgentStuck(t *testing.T) {
	cmd := exec.Command("sh", "-c", `trap "" TERM; echo "running (on exit: reset)"; exec sleep 1000`)
	out := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := func() string { b, _ := os.ReadFile(out); return string(b) }
	ran, killed, err := superviseAgent(cmd, read, time.Minute, time.Second)
	if !ran || !killed || err == nil {
		t.Errorf("an agent that ignores SIGTERM: ran %v, killed %v, exit %v; want it ran, killed, failing", ran, killed, err)
	}
}

// Every mode applies, runs its agent and resets with lanesCaps alone,
// leaving the testbed as it was; without any one of them lanes fails with
// the error capsWhy names, and leaves nothing applied.
func TestCapabilities(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("no setpriv (util-linux)")
	}
	tb := modetest.UpTestbed(t, testbed.Docker)
	bin := buildLanes(t)
	ns := tb.Receiver().NetNS
	before := modetest.Snapshot(t, tb)
	// A process of the receiver's namespace with every capability, as a
	// container runtime's root processes have more than lanes keeps.
	holder := exec.Command("ip", "netns", "exec", ns, "sleep", "1000")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	netnsOf := func(form string) string {
		if form == "pid" {
			return fmt.Sprintf("pid:%d", holder.Process.Pid)
		}
		return ns
	}
	modes := plan.Modes()
	if len(modes) < 11 {
		t.Fatalf("premise: lanes' modes are registered: %v", modes)
	}
	for _, m := range modes {
		if out, ok := capsAgent(t, bin, ns, m, lanesCaps); !ok {
			t.Errorf("mode %s with %v: the agent did not run and reset:\n%s", m, lanesCaps, out)
		}
	}
	if out, ok := capsAgent(t, bin, netnsOf("pid"), "rps", lanesCaps); !ok {
		t.Errorf("rps on pid:N with %v:\n%s", lanesCaps, out)
	}
	modetest.SameSnapshot(t, "after every mode with lanes' capabilities", modetest.Snapshot(t, tb), before)
	for _, c := range lanesCaps {
		why := capsWhy[c]
		var less []string
		for _, o := range lanesCaps {
			if o != c {
				less = append(less, o)
			}
		}
		out, ok := capsAgent(t, bin, netnsOf(why.netns), why.mode, less)
		if ok || !strings.Contains(out, why.fails) {
			t.Errorf("without %s, %s on %s: ran %v, want a failure saying %q:\n%s", c, why.mode, netnsOf(why.netns), ok, why.fails, out)
		}
	}
	modetest.SameSnapshot(t, "after the refused applies", modetest.Snapshot(t, tb), before)
}
