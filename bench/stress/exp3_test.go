package stress

import (
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mono() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func TestExpStart(t *testing.T) {
	if os.Getenv("EXP") == "" {
		t.Skip()
	}
	p := newPair(t)
	pinNAPI(t, p.rcv, "u1", 1)
	for i := 0; i < 3; i++ {
		g, err := NewGenerator(p.target, GenConfig{CPU: 0, Rate: 10000, Burst: 1024})
		if err != nil {
			t.Fatal(err)
		}
		t0 := mono()
		st, err := g.Run(context.Background(), 2*time.Second)
		t1 := mono()
		var s xdpGenGenState
		g.objs.State.Lookup(uint32(0), &s)
		// first send time = next_fp - sent*interval
		first := int64(s.StartNs)
		t.Logf("%+v %.0f; first send %v after Run start; schedule end %v before Run return", st, st.PPS(), time.Duration(first-t0), time.Duration(t1-int64(s.NextFp>>8)))
		g.Close()
	}
}
