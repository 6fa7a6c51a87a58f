package falcon

import (
	"testing"

	"github.com/lanesnet/lanes/datapath/steer"
)

// A later stage goes home (on its uncounted fast path) only behind the
// earlier stages: a stage that stays follows the core of the one before it,
// and only its counts keep its order when that core changes.
func TestMayGoHomeBehindEarlierStages(t *testing.T) {
	stay := allOf(steer.Stay)
	tables := [steer.NumStages][steer.Buckets]uint32{stay, stay, stay}
	a := &agent{
		home:      1,
		cfg:       steer.Config{CPUs: []int{0, 1}},
		stages:    []int{steer.StageBridge, steer.StageContainer, steer.StageSplit},
		homeFirst: map[int]bool{steer.StageSplit: true, steer.StageBridge: true, steer.StageContainer: true},
	}
	var act steer.Activity
	none := [steer.NumStages]bool{}
	if !a.mayGoHome(steer.StageSplit, none, &act, tables) {
		t.Error("split stage: nothing before it, want home")
	}
	if a.mayGoHome(steer.StageBridge, none, &act, tables) {
		t.Error("bridge stage went home with the split stage away")
	}
	a.atHome[steer.StageSplit] = true
	if a.mayGoHome(steer.StageBridge, none, &act, tables) {
		t.Error("bridge stage went home in the round the split stage did (its flows were read before)")
	}
	read := [steer.NumStages]bool{steer.StageSplit: true}
	if !a.mayGoHome(steer.StageBridge, read, &act, tables) {
		t.Error("bridge stage kept from home with the split stage home")
	}
	if a.mayGoHome(steer.StageContainer, read, &act, tables) {
		t.Error("container stage went home with the bridge stage away")
	}
	a.atHome[steer.StageBridge] = true
	read[steer.StageBridge] = true
	if !a.mayGoHome(steer.StageContainer, read, &act, tables) {
		t.Error("container stage kept from home behind stages at home")
	}
	// A staying flow holding frames on a core other than home keeps the
	// container stage from home; one holding them on the home core not.
	act.Held[steer.StageContainer] = 1 << 0
	if a.mayGoHome(steer.StageContainer, read, &act, tables) {
		t.Error("container stage went home with frames held on core 0")
	}
	act.Held[steer.StageContainer] = 1 << 1
	if !a.mayGoHome(steer.StageContainer, read, &act, tables) {
		t.Error("container stage kept from home by frames on the home core")
	}
	// An earlier stage gone from home since the read counts as away.
	a.atHome[steer.StageBridge] = false
	if a.mayGoHome(steer.StageContainer, read, &act, tables) {
		t.Error("container stage went home after the bridge stage left")
	}
	// Without a known home core nothing goes home.
	a.home = -1
	if a.mayGoHome(steer.StageSplit, read, &act, tables) {
		t.Error("a stage went home without a home core")
	}
}

// With prio the split stage is never at home: its home is the high and
// bulk queues on the IRQ core. The later stages may go home while it
// places every flow there, not while it spreads.
func TestMayGoHomeBehindPrioSplit(t *testing.T) {
	stay := allOf(steer.Stay)
	homeQ := allOf(1) // the IRQ core, cpu 1, is index 1
	tables := [steer.NumStages][steer.Buckets]uint32{homeQ, stay, stay}
	a := &agent{
		home:       1,
		homeQueued: true,
		cfg:        steer.Config{CPUs: []int{0, 1}},
		stages:     []int{steer.StageBridge, steer.StageContainer, steer.StageSplit},
		homeFirst:  map[int]bool{steer.StageBridge: true, steer.StageContainer: true},
	}
	var act steer.Activity
	act.Cores[steer.StageSplit] = 1 << 1
	none := [steer.NumStages]bool{}
	if !a.mayGoHome(steer.StageBridge, none, &act, tables) {
		t.Error("bridge stage kept from home with every flow in the IRQ core's queues")
	}
	act.Cores[steer.StageSplit] |= 1 << 0
	if a.mayGoHome(steer.StageBridge, none, &act, tables) {
		t.Error("bridge stage went home with a flow's split stage on core 0")
	}
	act.Cores[steer.StageSplit] = 1 << 1
	tables[steer.StageSplit][7] = 0
	if a.mayGoHome(steer.StageBridge, none, &act, tables) {
		t.Error("bridge stage went home with the split stage's table spreading")
	}
	if a.allHomeValue(steer.StageSplit, tables[steer.StageSplit]) || !a.allHomeValue(steer.StageBridge, stay) {
		t.Error("allHomeValue")
	}
}

func allOf(v uint32) [steer.Buckets]uint32 {
	var t [steer.Buckets]uint32
	for b := range t {
		t[b] = v
	}
	return t
}
