package falcon_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/policy/falcon"
	"github.com/lanesnet/lanes/testbed"
)

// failingSource fails while failing is set, else reports every core idle.
type failingSource struct{ failing atomic.Bool }

func (f *failingSource) Sample() (cpuload.Sample, error) {
	if f.failing.Load() {
		return cpuload.Sample{}, errors.New("sampler broke")
	}
	return cpuload.Sample{At: time.Now(), Interval: 40 * time.Millisecond, Cores: []cpuload.Core{{CPU: 0, Idle: 100}, {CPU: 1, Idle: 100}}}, nil
}

func (f *failingSource) Close() error { return nil }

// A falcon agent whose rounds keep failing does not die: it skips them,
// counts them, and after a streak holds every stage at home (vanilla
// placement, safe at any load); the first round that succeeds balances
// again.
func TestFalconAgentDegrades(t *testing.T) {
	cpus := online(t)
	tb := upTestbed(t, testbed.Docker)
	a := apply(t, tb, "falcon", map[string]string{"spread": "always"})
	dp := a.Open(t)
	placed := tables(t, dp)
	if allEqual(placed[steer.StageContainer], uint32(steer.Stay)) {
		t.Fatal("spread=always placed nothing by hash: nothing to see degrade")
	}
	src := &failingSource{}
	src.failing.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	status, done, err := falcon.RunOn(ctx, plan.AgentEnv{NetNS: a.NS, Mode: "falcon", Params: map[string]string{"spread": "always"}, CPUs: cpus, StateDir: t.TempDir()}, src)
	if err != nil {
		t.Fatal(err)
	}
	wait := func(what string, ok func(falcon.AgentStatus) bool) falcon.AgentStatus {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			select {
			case err := <-done:
				t.Fatalf("%s: the agent ended: %v", what, err)
			default:
			}
			if st := status(); ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: status after 10 s: %+v", what, status())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	st := wait("degrading", func(s falcon.AgentStatus) bool { return s.Degraded })
	if st.FailedRounds < 25 || st.LastError == "" {
		t.Errorf("degraded after %d failed rounds (last error %q), want 25 or more and the error", st.FailedRounds, st.LastError)
	}
	for _, s := range []int{steer.StageBridge, steer.StageContainer} {
		if tab := tables(t, dp)[s]; !allEqual(tab, uint32(steer.Stay)) {
			t.Errorf("degraded: %s table not all at home", steer.StageName(s))
		}
	}
	src.failing.Store(false)
	wait("recovering", func(s falcon.AgentStatus) bool { return !s.Degraded && s.LastError == "" })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("agent: %v", err)
	}
}
