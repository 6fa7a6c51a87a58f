package knobs_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
)

func TestParseCPUList(t *testing.T) {
	good := []struct {
		in   string
		want []int
		out  string
	}{
		{"0", []int{0}, "0"},
		{"0-3", []int{0, 1, 2, 3}, "0-3"},
		{" 0-1,3,5-6\n", []int{0, 1, 3, 5, 6}, "0-1,3,5-6"},
		{"3,1,2,1", []int{1, 2, 3}, "1-3"},
		{"7-7", []int{7}, "7"},
		{"0,2,4", []int{0, 2, 4}, "0,2,4"},
	}
	for _, tc := range good {
		got, err := knobs.ParseCPUList(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		if s := knobs.FormatCPUList(got); s != tc.out {
			t.Errorf("FormatCPUList(%v) = %q, want %q", got, s, tc.out)
		}
	}
	bad := map[string]string{
		"":      "empty",
		"a":     "not a core",
		"1-":    "not a core",
		"-1":    "not a core",
		"3-1":   "backwards",
		"1,,2":  "not a core",
		"99999": "beyond any machine",
		"0x1":   "not a core",
	}
	for in, want := range bad {
		_, err := knobs.ParseCPUList(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCPUList(%q) error %v, want one containing %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseCPUList(%q) error spans lines: %q", in, err)
		}
	}
}

func TestCPUMask(t *testing.T) {
	cases := []struct {
		mask string
		cpus []int
		out  string
	}{
		{"0", nil, "0"},
		{"00000000,00000000\n", nil, "0"},
		{"3", []int{0, 1}, "3"},
		{"00000003", []int{0, 1}, "3"},
		{"f0", []int{4, 5, 6, 7}, "f0"},
		{"1,00000000", []int{32}, "1,00000000"},
		{"00000001,80000001", []int{0, 31, 32}, "1,80000001"},
		{"00000000,00000002", []int{1}, "2"},
	}
	for _, tc := range cases {
		got, err := knobs.ParseCPUMask(tc.mask)
		if err != nil || !slices.Equal(got, tc.cpus) {
			t.Errorf("ParseCPUMask(%q) = %v, %v; want %v", tc.mask, got, err, tc.cpus)
			continue
		}
		if s := knobs.FormatCPUMask(got); s != tc.out {
			t.Errorf("FormatCPUMask(%v) = %q, want %q", got, s, tc.out)
		}
	}
	for _, in := range []string{"", "g", "123456789", "1,,2", ",1"} {
		if _, err := knobs.ParseCPUMask(in); err == nil {
			t.Errorf("ParseCPUMask(%q) succeeded, want an error", in)
		}
	}
}

func TestSchedFormat(t *testing.T) {
	for _, s := range []string{
		"policy=other prio=0 nice=0",
		"policy=fifo prio=50 nice=0",
		"policy=rr prio=1 nice=0 reset-on-fork",
		"policy=other prio=0 nice=-5",
		"policy=batch prio=0 nice=19",
	} {
		a, err := knobs.ParseSched(s)
		if err != nil {
			t.Errorf("ParseSched(%q): %v", s, err)
			continue
		}
		if got := knobs.FormatSched(a); got != s {
			t.Errorf("FormatSched(ParseSched(%q)) = %q", s, got)
		}
	}
	for _, s := range []string{"", "prio=3", "policy=fifo prio=0", "policy=lol", "policy=other x", "policy=other prio=a"} {
		if _, err := knobs.ParseSched(s); err == nil {
			t.Errorf("ParseSched(%q) succeeded, want an error", s)
		}
	}
}

func TestOnlineCPUs(t *testing.T) {
	cpus, err := knobs.OnlineCPUs()
	if err != nil || len(cpus) == 0 {
		t.Fatalf("OnlineCPUs = %v, %v", cpus, err)
	}
	if err := knobs.CheckCPUs(cpus); err != nil {
		t.Errorf("CheckCPUs(online): %v", err)
	}
	if err := knobs.CheckCPUs([]int{cpus[len(cpus)-1] + 1}); err == nil || !strings.Contains(err.Error(), "is not online") {
		t.Errorf("CheckCPUs(beyond) = %v, want not online", err)
	}
}
