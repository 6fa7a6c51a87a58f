package control_test

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/modetest"
	"github.com/lanesnet/lanes/internal/overlaytest"
	"github.com/lanesnet/lanes/testbed"
)

// On the overlays flanneld and dockerd build, lanes agent follows the
// containers their runtimes start and remove: a CNI attachment (Flannel),
// `docker run` and `docker rm -f` (Docker, whose containers' namespaces
// and host-side veths live in namespaces dockerd bound under its
// exec-root, and whose containers' /sys is read-only). The container
// started after the apply is adopted, a stream into it arrives in order,
// its knobs are journaled where its devices are; removed, it is let go
// of; reset then puts every knob back as before the apply.
func TestFollowRealOverlays(t *testing.T) {
	for _, o := range testbed.Overlays {
		t.Run(o, func(t *testing.T) {
			tb := modetest.UpTestbedOverlay(t, o)
			prefix := tb.Config.Prefix
			r, src := tb.Receiver(), tb.Sender().Containers[0]
			before := modetest.Snapshot(t, tb)
			a := modetest.Apply(t, tb, "falcon", map[string]string{"spread": "always"})
			ag, _ := a.StartAgent(t)

			c3, err := testbed.AddContainer(prefix, 2)
			if err != nil {
				t.Fatal(err)
			}
			// The container's own device is adopted on an event of its
			// own, after its host-side veth (Flannel's CNI moves it into
			// the container and renames it): wait for both.
			devs := []struct{ ns, dev string }{{r.OverlayNS(), c3.HostVeth}, {c3.NetNS, c3.Veth}}
			waitFollowed(t, ag, "adopting "+c3.Name+" and journaling its devices", func(st control.FollowStatus) bool {
				for _, d := range devs {
					if len(journaledOn(t, a, d.ns, d.dev)) == 0 {
						return false
					}
				}
				return adopted(c3, 1)(st)
			})
			time.Sleep(1200 * time.Millisecond) // past the adoption window
			overlaytest.Warm(t, src.NetNS, c3.NetNS, c3.Addr.Addr())
			overlaytest.Stream{Count: 2000, Size: 64, Burst: 50, Pause: time.Millisecond, CPU: 0}.Delivered(t, "stream into "+c3.Name, true, src.NetNS, c3.NetNS, c3.Addr.Addr())
			overlaytest.TCP(t, src.NetNS, c3.NetNS, c3.Addr.Addr(), 1<<20)

			if err := testbed.RemoveContainer(prefix, 2, c3.Name); err != nil {
				t.Fatal(err)
			}
			waitFollowed(t, ag, "letting go of "+c3.Name, func(st control.FollowStatus) bool {
				return len(st.Dropped) > 0 && len(journaledOn(t, a, r.OverlayNS(), c3.HostVeth)) == 0
			})
			a.Reset(t)
			modetest.SameSnapshot(t, "after reset, the added container gone", modetest.Snapshot(t, tb), before)
			overlaytest.UDPMost(t, src.NetNS, r.Containers[0].NetNS, r.Containers[0].Addr.Addr(), 200)
		})
	}
}

// An apply killed halfway on a real overlay (rps: it writes the
// containers' RPS maps, which on Docker's overlay means a sysfs the
// runtime mounted read-only) is recovered by reset, byte for byte.
func TestKilledApplyRecoversOnRealOverlays(t *testing.T) {
	for _, o := range testbed.Overlays {
		t.Run(o, func(t *testing.T) {
			tb := modetest.UpTestbedOverlay(t, o)
			ns := tb.Receiver().NetNS
			stateDir := t.TempDir()
			before := modetest.Snapshot(t, tb)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
			cmd.Env = append(os.Environ(), control.CrashEnv.NetNS+"="+ns, control.CrashEnv.Dir+"="+stateDir, control.CrashEnv.After+"=2")
			out, err := cmd.CombinedOutput()
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
			}
			st, err := control.ReadState(control.Dir(stateDir, ns))
			if err != nil || st == nil || st.Phase != control.Applying {
				t.Errorf("state after the kill: %+v, %v; want phase applying", st, err)
			}
			res, err := control.Reset(ns, stateDir)
			if err != nil {
				t.Fatal(err)
			}
			if res.Nothing || res.Report == nil || len(res.Report.Restored) != 3 {
				t.Errorf("reset after kill: %+v, want 3 knobs restored", res)
			}
			modetest.SameSnapshot(t, "after reset of the killed apply", modetest.Snapshot(t, tb), before)
			modetest.NoState(t, stateDir)
		})
	}
}
