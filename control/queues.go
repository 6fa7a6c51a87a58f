package control

import (
	"context"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
)

// withReconciler runs the steering datapath's queue reconciler
// (steer.Reconciler) beside a mode's agent: a frame lost where nothing
// reports it would otherwise hold the flows waiting on its core's queues
// for good. It does nothing where no steering datapath is pinned.
type withReconciler struct {
	plan.Agent
	r *steer.Reconciler
}

func (w withReconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.r.Run(ctx)
	}()
	err := w.Agent.Run(ctx)
	cancel()
	<-done
	return err
}

// reconcilerOnly is the agent of a static mode with a steering datapath:
// nothing of its own, the reconciler beside it.
type reconcilerOnly struct{ mode string }

func (a reconcilerOnly) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (a reconcilerOnly) Status() any {
	return reconcilerOnlyStatus{Agent: "queue reconciler only: " + a.mode + " has no run-time part of its own"}
}

type reconcilerOnlyStatus struct {
	Agent string `json:"agent"`
}

func (s reconcilerOnlyStatus) Summary() []string { return []string{s.Agent} }
