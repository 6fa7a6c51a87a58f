package onpath

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"context"

	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/internal/nsx"
	"github.com/lanesnet/lanes/internal/testenv"
)

// A netlink socket that overflowed lost notifications, any of which may
// have mattered: the watch withdraws the destinations then, as for a
// change it saw. The overflow is forced with a receive buffer at the
// kernel's minimum and a burst of link changes (veth pairs made) in a throwaway namespace.
func TestWatchOverflowWithdraws(t *testing.T) {
	ns := watchNetNS(t, "lanes-watch")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := Watch(ctx, []string{ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, s := range w.socks {
		if err := s.SetReceiveBufferSize(1, true); err != nil {
			t.Fatal(err)
		}
	}
	// The reader drains as fast as it can; hold it back by filling the
	// events channel first, so the kernel's queue overflows.
	for range cap(w.events) {
		w.events <- Event{}
	}
	err = nsx.Do(ns, func() error {
		for i := range 150 {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("lw%da", i)}, PeerName: fmt.Sprintf("lw%db", i)}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case ev := <-w.events:
			if ev.Withdraw && strings.Contains(ev.Why, "lost") {
				return
			}
		case <-deadline:
			t.Fatal("no withdrawal after the socket overflowed")
		}
	}
}

// A watch ends every goroutine it started when it is closed, however
// often the agent subscribes again under one context, and when its
// context ends.
func TestWatchEndsItsGoroutines(t *testing.T) {
	ns := watchNetNS(t, "lanes-watchg")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := runtime.NumGoroutine()
	for range 20 {
		w, err := Watch(ctx, []string{ns}, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	if n := goroutinesBackTo(before); n != before {
		t.Errorf("%d goroutines after 20 watches closed, %d before", n, before)
	}
	wctx, wcancel := context.WithCancel(ctx)
	w, err := Watch(wctx, []string{ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wcancel()
	w.wg.Wait() // the context's end stopped it: its readers return
	if n := goroutinesBackTo(before); n != before {
		t.Errorf("%d goroutines once the watch's context ended, %d before", n, before)
	}
}

// goroutinesBackTo is the number of goroutines once it is back to n, or
// after 5 s: a goroutine that has done its work may still be counted
// while it exits (one that released a namespace's locked thread), but a
// leaked one stays.
func goroutinesBackTo(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

// A subscription whose reader fails unexpectedly (its socket closed under
// it) is not left silent: the watch says it is broken and sends a
// withdrawal naming the failure.
func TestWatchReportsBrokenSubscription(t *testing.T) {
	ns := watchNetNS(t, "lanes-watchb")
	w, err := Watch(context.Background(), []string{ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Broken() != nil {
		t.Fatalf("premise: a fresh watch is whole: %v", w.Broken())
	}
	w.socks[0].Close()
	select {
	case ev := <-w.events:
		if !ev.Withdraw || !strings.Contains(ev.Why, "netlink watch failed") {
			t.Errorf("event %+v: want a withdrawal for the failed watch", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event after a subscription failed")
	}
	if w.Broken() == nil {
		t.Error("the watch does not say it is broken")
	}
}

// watchNetNS is a namespace of the test's own, named after prefix, gone
// when the test ends.
func watchNetNS(t *testing.T, prefix string) string {
	t.Helper()
	testenv.Root(t)
	ns := fmt.Sprintf("%s-%d", prefix, os.Getpid())
	if err := nsx.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsx.Delete(ns) })
	return ns
}
