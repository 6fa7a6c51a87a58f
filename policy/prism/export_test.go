package prism

import (
	"sync"

	"github.com/lanesnet/lanes/policy/onpath"
)

// SetGuardRule makes new guards (the ladder's and bulk-sched's) use r
// until the returned undo. r.Tasks does not reach bulk-sched's guard: it
// takes the plan's guard-tasks (give "guard-tasks": "0" to drop the
// condition).
func SetGuardRule(r GuardRule) (undo func()) {
	old, oldBulk := guardRule, bulkGuardRule
	guardRule, bulkGuardRule = r, r
	return func() { guardRule, bulkGuardRule = old, oldBulk }
}

// GuardOff is the NIC poll's scheduling while the guard holds it off the
// ladder.
const GuardOff = guardOff

// OnWatch, RefuseWatch and BeforeWatch act on the netlink watches a sync
// agent subscribes (onpath's test hooks).
var (
	OnWatch     = onpath.OnWatch
	RefuseWatch = onpath.RefuseWatch
	BeforeWatch = onpath.BeforeWatch
)

// HoldSyncRound makes the next round of a sync agent wait, from its
// start, until release; held is closed once it waits.
func HoldSyncRound() (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	f := func() { once.Do(func() { close(h); <-r }) }
	testRound.Store(&f)
	return h, func() {
		released.Do(func() {
			testRound.Store(nil)
			close(r)
		})
	}
}
