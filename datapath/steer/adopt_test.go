//go:build linux

package steer

import (
	"testing"
	"time"
)

// TestContainerAdoptWindow: while a host-side veth's adoption window is
// open (a container lanes adopted after apply), a flow without state at
// the container stage starts at Stay, where the kernel runs it, whatever
// the table says, and keeps it while its frames are in flight; once the
// window closes, a new flow takes the table at once, as everywhere. The
// window is the container stage's only: the bridge stage on the same
// device index takes the table.
func TestContainerAdoptWindow(t *testing.T) {
	d, cores := newDatapath(t)
	for _, st := range []int{StageBridge, StageContainer} {
		if err := d.Placement().SetTable(st, spreadTable(len(cores))); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Order().SetAdopting(time.Minute, loIfindex); err != nil {
		t.Fatal(err)
	}
	if w, err := d.Order().Adopting(); err != nil || w[loIfindex] <= 0 {
		t.Fatalf("adoption windows %v (%v): want one open on ifindex %d", w, err, loIfindex)
	}
	running := udpFlow(40000)
	for range 3 {
		runTC(t, d.TCEgress(), innerFrame(frameSpec{flow: running}))
	}
	if fl := mustFlow(t, d, running, StageContainer); fl.CPUIndex != Stay || fl.InFlight != 3 {
		t.Errorf("flow seen in the window: state %+v, want Stay with its 3 frames counted in flight", fl)
	}
	bridge := udpFlow(40001)
	runTC(t, d.TCIngress(), vxlanFrame(frameSpec{flow: bridge}))
	if fl, want := mustFlow(t, d, bridge, StageBridge), uint32(Bucket(bridge.hash(), loIfindex, StageBridge)%len(cores)); fl.CPUIndex != want {
		t.Errorf("bridge stage in a container's window: index %d, want the table's %d", fl.CPUIndex, want)
	}

	// Closed: the next new flow is placed by the table; the one seen in
	// the window stays while its frames are in flight.
	if err := d.Order().SetAdopting(0, loIfindex); err != nil {
		t.Fatal(err)
	}
	if w, err := d.Order().Adopting(); err != nil || len(w) != 0 {
		t.Fatalf("adoption windows %v (%v) after closing", w, err)
	}
	fresh := udpFlow(40002)
	runTC(t, d.TCEgress(), innerFrame(frameSpec{flow: fresh}))
	if fl, want := mustFlow(t, d, fresh, StageContainer), uint32(Bucket(fresh.hash(), loIfindex, StageContainer)%len(cores)); fl.CPUIndex != want {
		t.Errorf("new flow after the window: index %d, want the table's %d", fl.CPUIndex, want)
	}
	runTC(t, d.TCEgress(), innerFrame(frameSpec{flow: running}))
	if fl := mustFlow(t, d, running, StageContainer); fl.CPUIndex != Stay {
		t.Errorf("flow with frames in flight moved when the window closed: index %d", fl.CPUIndex)
	}
	if err := d.Order().SetAdopting(time.Second, 0); err == nil {
		t.Error("a window for ifindex 0 was accepted")
	}
}
