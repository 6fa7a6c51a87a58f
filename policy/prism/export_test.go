package prism

import (
	"errors"
	"sync"
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

// OnWatch tells f of each netlink watch a sync agent subscribes, with a
// function that breaks it as an unexpected read error would (one of its
// sockets closed under its reader), until undo.
func OnWatch(f func(breakIt func())) (undo func()) {
	testWatched = func(w *watcher) {
		f(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.socks) > 0 {
				w.socks[0].Close()
			}
		})
	}
	return func() { testWatched = nil }
}

// RefuseWatch makes every netlink watch a sync agent subscribes fail, as
// a subscription the kernel refuses would, until undo.
func RefuseWatch() (undo func()) {
	f := func([]string) error { return errors.New("test: subscriptions refused") }
	testSubscribe.Store(&f)
	return func() { testSubscribe.Store(nil) }
}

// BeforeWatch runs f before each netlink watch a sync agent subscribes,
// on the agent's goroutine, until undo.
func BeforeWatch(f func()) (undo func()) {
	g := func([]string) error { f(); return nil }
	testSubscribe.Store(&g)
	return func() { testSubscribe.Store(nil) }
}

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
