package steer

import (
	"maps"
	"testing"
)

// TestLostFrames: frames are booked lost only on a core whose counts did
// not move between the samples and whose threads were all asleep.
func TestLostFrames(t *testing.T) {
	stuck := Queue{Core: 1, Enqueued: 100, Seen: 90, DroppedRing: 7} // 3 unaccounted
	moving := Queue{Core: 1, Enqueued: 120, Seen: 110, DroppedRing: 7}
	empty := Queue{Core: 0, Enqueued: 50, Seen: 50}
	untracked := stuck
	untracked.Untracked = true
	for _, tc := range []struct {
		name          string
		before, after []Queue
		asleep        map[int]bool
		want          map[int]uint64
	}{
		{"stuck and asleep", []Queue{empty, stuck}, []Queue{empty, stuck}, map[int]bool{0: true, 1: true}, map[int]uint64{1: 3}},
		{"kthread runnable (starved)", []Queue{stuck}, []Queue{stuck}, map[int]bool{1: false}, map[int]uint64{}},
		{"nothing known about the core's threads", []Queue{stuck}, []Queue{stuck}, map[int]bool{}, map[int]uint64{}},
		{"candidates (no thread states yet)", []Queue{empty, stuck}, []Queue{empty, stuck}, nil, map[int]uint64{1: 3}},
		{"counts moved", []Queue{stuck}, []Queue{moving}, map[int]bool{1: true}, map[int]uint64{}},
		{"nothing queued", []Queue{empty}, []Queue{empty}, map[int]bool{0: true}, map[int]uint64{}},
		{"untracked", []Queue{untracked}, []Queue{untracked}, map[int]bool{1: true}, map[int]uint64{}},
		{"new core", nil, []Queue{stuck}, map[int]bool{1: true}, map[int]uint64{}},
	} {
		if got := lostFrames(tc.before, tc.after, tc.asleep); !maps.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
