package onpath

import "errors"

// Hooks for the tests of the agents that watch (they live in other
// packages, so these are not in a _test file).

// OnWatch tells f of each watch subscribed, with a function that breaks
// it as an unexpected read error would (one of its sockets closed under
// its reader), until undo.
func OnWatch(f func(breakIt func())) (undo func()) {
	g := func(w *Watcher) {
		f(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if len(w.socks) > 0 {
				w.socks[0].Close()
			}
		})
	}
	testWatched.Store(&g)
	return func() { testWatched.Store(nil) }
}

// RefuseWatch makes every watch fail, as a subscription the kernel
// refuses would, until undo.
func RefuseWatch() (undo func()) {
	f := func([]string) error { return errors.New("test: subscriptions refused") }
	testSubscribe.Store(&f)
	return func() { testSubscribe.Store(nil) }
}

// BeforeWatch runs f before each watch subscribes, on the subscriber's
// goroutine, until undo.
func BeforeWatch(f func()) (undo func()) {
	g := func([]string) error { f(); return nil }
	testSubscribe.Store(&g)
	return func() { testSubscribe.Store(nil) }
}
