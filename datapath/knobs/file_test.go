package knobs_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// A file knob in a namespace that is gone reads and writes as gone, which
// Restore skips: the namespace helpers' ErrGone is the knobs' one.
func TestFileKnobGoneNetNS(t *testing.T) {
	ns := filepath.Join(t.TempDir(), "netns") // a namespace file that is not there
	for _, k := range []knobs.Knob{
		knobs.Sysfs(ns, "/sys/class/net/lo/tx_queue_len"),
		knobs.ProcSys(ns, "/proc/sys/net/core/somaxconn"),
	} {
		if _, err := k.Read(); !errors.Is(err, knobs.ErrGone) {
			t.Errorf("reading %s: %v, want ErrGone", k, err)
		}
		if err := k.Write([]byte("1000")); !errors.Is(err, knobs.ErrGone) {
			t.Errorf("writing %s: %v, want ErrGone", k, err)
		}
	}
}
