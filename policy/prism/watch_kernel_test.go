package prism

import (
	"fmt"
	"os"
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
	testenv.Root(t)
	ns := fmt.Sprintf("lanes-watch-%d", os.Getpid())
	if err := nsx.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nsx.Delete(ns) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := watch(ctx, []string{ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	for _, s := range w.socks {
		if err := s.SetReceiveBufferSize(1, true); err != nil {
			t.Fatal(err)
		}
	}
	// The reader drains as fast as it can; hold it back by filling the
	// events channel first, so the kernel's queue overflows.
	for range cap(w.events) {
		w.events <- watchEvent{}
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
			if ev.withdraw && strings.Contains(ev.why, "lost") {
				return
			}
		case <-deadline:
			t.Fatal("no withdrawal after the socket overflowed")
		}
	}
}
