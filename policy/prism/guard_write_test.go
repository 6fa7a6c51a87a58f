package prism

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/internal/testenv"
	"github.com/lanesnet/lanes/topology"
	"github.com/lanesnet/lanes/topology/topotest"
)

// TestGuardWritesTheJournaledThread: the guard writes a NAPI thread's
// scheduling as the apply journaled it, thread and all. A thread made
// under the same name since the apply (threaded NAPI switched off and
// on) is another thread: the guard's write to the ladder is refused as
// gone and leaves it at its own scheduling, and the reset, which skips
// the replaced thread, leaves nothing at SCHED_FIFO.
func TestGuardWritesTheJournaledThread(t *testing.T) {
	testenv.Root(t)
	f := topotest.New(t, topotest.Options{Containers: 1})
	h := f.Hosts[1]
	c := h.Containers[0]
	threaded := knobs.Sysfs(c.NetNS, "/sys/class/net/"+c.Veth+"/threaded")
	setThreaded := func(v string) {
		t.Helper()
		if err := threaded.Write([]byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	setThreaded("1")
	t.Cleanup(func() { threaded.Write([]byte("0")) })
	napiThread := func() kthread.Info {
		t.Helper()
		topo, err := topology.Discover(h.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		ths := topo.Containers[0].Interfaces[0].NAPIThreads
		if len(ths) != 1 {
			t.Fatalf("premise: NAPI threads of %s: %+v, want one", c.Veth, ths)
		}
		return ths[0]
	}
	sched := func(th kthread.Info) string {
		t.Helper()
		b, err := knobs.Sched(th.Comm, th.Index).Read()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}

	// The apply: the thread on the ladder, journaled.
	th := napiThread()
	const ladder = "policy=fifo prio=50 nice=0"
	state := filepath.Join(t.TempDir(), "state")
	j, err := knobs.Open(state, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Set(knobs.Sched(th.Comm, th.Index), []byte(ladder)); err != nil {
		t.Fatal(err)
	}
	gen := knobs.Generation(j.Entries())
	j.Close()
	reset := func() *knobs.Report {
		t.Helper()
		j, err := knobs.Open(state, "test")
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		rep, err := j.Restore()
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	t.Cleanup(func() {
		if knobs.Exists(state) {
			reset()
		}
	})

	n := &nicTarget{threads: []kthread.Info{th}, onLadder: ladder, off: guardOff, dir: state, gen: gen}
	if err := n.set(true); err != nil || sched(th) != guardOff {
		t.Fatalf("premise: the guard demotes the thread the apply changed: %v, now %q", err, sched(th))
	}

	setThreaded("0")
	setThreaded("1")
	now := napiThread()
	if now.Comm != th.Comm || now.PID == th.PID {
		t.Fatalf("premise: threaded NAPI off and on makes a new thread of the same name: %s (pid %d), was %s (pid %d)", now.Comm, now.PID, th.Comm, th.PID)
	}
	own := sched(now)
	if own == ladder {
		t.Fatalf("premise: the new thread starts at %q, the ladder's value", own)
	}
	if err := n.set(false); !errors.Is(err, knobs.ErrGone) {
		t.Errorf("the guard's write to the ladder after the thread was replaced: %v, want gone", err)
	}
	if got := sched(now); got != own {
		t.Errorf("the new thread after the guard's write: %q, want its own %q", got, own)
	}
	rep := reset()
	if len(rep.Skipped) != 1 {
		t.Errorf("reset %+v: want the replaced thread's knob skipped", rep)
	}
	if got := sched(now); got != own {
		t.Errorf("the new thread after the reset: %q, want its own %q", got, own)
	}
}
