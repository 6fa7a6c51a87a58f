package falcon

import (
	"context"
	"errors"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/cpuload"
)

// ParkLikeAKilledAgent parks the target's path as an agent does and leaves
// it so, as an agent killed while parked would.
func ParkLikeAKilledAgent(stateDir string) error {
	o := Defaults()
	o.Split = false // split=auto on the testbed's veth underlay
	p, err := newParker(o, stateDir)
	if err != nil {
		return err
	}
	if p.off != "" {
		return errors.New("cannot park: " + p.off)
	}
	return p.park()
}

// RunOn runs a falcon agent (from newAgent's env) with src as its load
// source until ctx ends, for fault tests; status reads its status.
func RunOn(ctx context.Context, env plan.AgentEnv, src cpuload.Source) (status func() AgentStatus, done <-chan error, err error) {
	ag, err := newAgent(env)
	if err != nil {
		return nil, nil, err
	}
	a := ag.(*agent)
	ch := make(chan error, 1)
	go func() {
		defer a.dp.Close()
		defer a.restore()
		ch <- a.loop(ctx, src)
	}()
	return func() AgentStatus { return a.Status().(AgentStatus) }, ch, nil
}
