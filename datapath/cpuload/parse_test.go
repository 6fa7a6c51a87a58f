package cpuload

import (
	"strings"
	"testing"
)

// A 4-CPU /proc/stat as kernel 6.x prints it, intr line shortened.
const procStat = `cpu  9775 12 35379 25072 327 0 16649 74 0 0
cpu0 4641 5 16194 12270 27 0 10545 26 0 0
cpu1 5134 7 19185 12802 300 3 6103 48 0 0
cpu2 0 0 0 0 0 0 0 0 0 0
cpu3 1 2 3 4 5 6 7 8 9 10
intr 4718718 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 16 0 0 0 0 89 53 0 19 1 44698
ctxt 12891723
btime 1767000000
processes 14012
procs_running 3
procs_blocked 0
softirq 5581812 0 389710 32 3306522 0 0 1020 1115720 0 768808
`

func TestParseStat(t *testing.T) {
	got, err := ParseStat(strings.NewReader(procStat))
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]CPUTimes{
		0: {4641, 5, 16194, 12270, 27, 0, 10545, 26},
		1: {5134, 7, 19185, 12802, 300, 3, 6103, 48},
		2: {},
		3: {1, 2, 3, 4, 5, 6, 7, 8}, // guest, guest_nice not kept
	}
	if len(got) != len(want) {
		t.Fatalf("got %d CPUs, want %d: %v", len(got), len(want), got)
	}
	for cpu, w := range want {
		if got[cpu] != w {
			t.Errorf("cpu%d = %+v, want %+v", cpu, got[cpu], w)
		}
	}
	if tot := got[3].Total(); tot != 36 {
		t.Errorf("cpu3 total %d, want 36 (guest time is already in user)", tot)
	}
}

func TestParseStatShapes(t *testing.T) {
	// Offline CPUs leave gaps; old kernels stop after idle or iowait.
	got, err := ParseStat(strings.NewReader("cpu  1 1 1 1\ncpu0 1 2 3 4\ncpu5 1 2 3 4 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != (CPUTimes{User: 1, Nice: 2, System: 3, Idle: 4}) || got[5].IOWait != 5 || len(got) != 2 {
		t.Errorf("got %+v", got)
	}
	// Lines far longer than bufio's default token limit.
	long := "intr " + strings.Repeat("0 ", 100000) + "\ncpu0 1 2 3 4\n"
	if _, err := ParseStat(strings.NewReader(long)); err != nil {
		t.Errorf("long intr line: %v", err)
	}
	for _, bad := range []string{"", "cpu  1 2 3 4\n", "cpu0 1 2\n", "cpu0 1 2 x 4\n"} {
		if _, err := ParseStat(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseStat(%q): no error", bad)
		}
	}
}

func TestParsePIDList(t *testing.T) {
	got, err := parsePIDList("3 4 5 3922 3926 \n")
	if err != nil || len(got) != 5 || got[3] != 3922 {
		t.Errorf("got %v, %v", got, err)
	}
	if got, err := parsePIDList(""); err != nil || len(got) != 0 {
		t.Errorf("empty list: %v, %v", got, err)
	}
	if _, err := parsePIDList("3 x"); err == nil {
		t.Error("no error for a bad pid")
	}
}

func TestIsRxKthread(t *testing.T) {
	for comm, want := range map[string]bool{
		"napi/eth0-8195":   true,
		"napi/vxlan0-0":    true,
		"cpumap/0/map:12":  true,
		"ksoftirqd/0":      false,
		"kworker/0:1-napi": false,
		"xnapi/eth0":       false,
	} {
		if got := IsRxKthread(comm); got != want {
			t.Errorf("IsRxKthread(%q) = %v", comm, got)
		}
	}
}
