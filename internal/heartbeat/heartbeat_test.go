package heartbeat

import (
	"strings"
	"testing"
	"time"
)

// A loop that stops beating is overdue once StaleAfter (or five of its
// periods) passed, named; one that beats is not; a dozing loop's beat is
// due five dozes on; a stopped loop leaves the board. A nil board's
// beats do nothing.
func TestBoard(t *testing.T) {
	now := time.Unix(1000, 0)
	b := NewBoard(func() time.Time { return now })
	fast := b.Loop("fast", 100*time.Millisecond)
	slow := b.Loop("slow", 10*time.Second)
	dozer := b.Loop("dozer", 100*time.Millisecond)
	dozer.Doze(time.Minute)
	now = now.Add(StaleAfter + time.Second)
	fast.Beat()
	if s := Stuck(b.Loops()); len(s) != 0 {
		t.Errorf("stuck %q: the fast loop beat, the slow one's due is 50 s, the dozer's 5 min", s)
	}
	now = now.Add(StaleAfter + time.Second)
	dozer.Doze(0) // awake: its period again
	s := Stuck(b.Loops())
	if len(s) != 1 || !strings.HasPrefix(s[0], "fast: no beat for 6.0s") {
		t.Errorf("stuck %q, want the fast loop alone", s)
	}
	now = now.Add(45 * time.Second)
	if s := Stuck(b.Loops()); len(s) != 3 {
		t.Errorf("stuck %q, want all three", s)
	}
	fast.Stop()
	slow.Stop()
	dozer.Stop()
	if l := b.Loops(); len(l) != 0 {
		t.Errorf("loops %v after they stopped", l)
	}
	var none *Board
	h := none.Loop("x", time.Second)
	h.Beat()
	h.Doze(time.Second)
	h.Stop()
	if none.Loops() != nil {
		t.Error("a nil board lists loops")
	}
}
