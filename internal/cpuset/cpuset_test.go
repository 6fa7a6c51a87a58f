package cpuset_test

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/internal/cpuset"
)

func TestList(t *testing.T) {
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
		got, err := cpuset.ParseList(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		if s := cpuset.FormatList(got); s != tc.out {
			t.Errorf("FormatList(%v) = %q, want %q", got, s, tc.out)
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
		_, err := cpuset.ParseList(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseList(%q) error %v, want one containing %q", in, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseList(%q) error spans lines: %q", in, err)
		}
	}
}

func TestMask(t *testing.T) {
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
		got, err := cpuset.ParseMask(tc.mask)
		if err != nil || !slices.Equal(got, tc.cpus) {
			t.Errorf("ParseMask(%q) = %v, %v; want %v", tc.mask, got, err, tc.cpus)
			continue
		}
		if s := cpuset.FormatMask(got); s != tc.out {
			t.Errorf("FormatMask(%v) = %q, want %q", got, s, tc.out)
		}
	}
	for _, in := range []string{"", "g", "123456789", "1,,2", ",1"} {
		if _, err := cpuset.ParseMask(in); err == nil {
			t.Errorf("ParseMask(%q) succeeded, want an error", in)
		}
	}
}

func TestOnline(t *testing.T) {
	cpus, err := cpuset.Online()
	if err != nil || len(cpus) == 0 {
		t.Fatalf("Online = %v, %v", cpus, err)
	}
	if err := cpuset.Check(cpus); err != nil {
		t.Errorf("Check(online): %v", err)
	}
	if err := cpuset.Check([]int{cpus[len(cpus)-1] + 1}); err == nil || !strings.Contains(err.Error(), "is not online") {
		t.Errorf("Check(beyond) = %v, want not online", err)
	}
}

// TestKeepProcessOff narrows every thread of a child process (this test
// binary again, so that the test's own process keeps its cores).
func TestKeepProcessOff(t *testing.T) {
	if os.Getenv("LANES_KEEP_PROCESS_OFF") == "1" {
		online, _ := cpuset.Online()
		avoid := online[len(online)-1]
		off, err := cpuset.KeepProcessOff([]int{avoid})
		if err != nil || len(off) != len(online)-1 {
			t.Fatalf("off %v (%v)", off, err)
		}
		// A thread started now inherits the narrowed set.
		done := make(chan struct{})
		go func() { runtime.LockOSThread(); close(done); select {} }()
		<-done
		tasks, _ := os.ReadDir("/proc/self/task")
		for _, tk := range tasks {
			b, err := os.ReadFile("/proc/self/task/" + tk.Name() + "/status")
			if err != nil {
				continue
			}
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) != cpuset.FormatList(off) {
					t.Errorf("thread %s allowed %s, want %s", tk.Name(), strings.TrimSpace(v), cpuset.FormatList(off))
				}
			}
		}
		return
	}
	online, err := cpuset.Online()
	if err != nil || len(online) < 2 {
		t.Skipf("needs two or more cores (online %v, %v)", online, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeepProcessOff$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LANES_KEEP_PROCESS_OFF=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
