package main

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSuite(t *testing.T) {
	in := `# comment
./control  ^TestEvery$/^docker$  kernels=6.12,newest  timeout=15m  known=6.12  quick

./datapath/steer  .  skip=^TestPrioBulkQuiet$  # every test but one
`
	es, err := parseSuite(strings.NewReader(in), "suite")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("%d entries, want 2: %+v", len(es), es)
	}
	e := es[0]
	if e.Pkg != "./control" || e.Run != "^TestEvery$/^docker$" || !slices.Equal(e.Kernels, []string{"6.12", "newest"}) ||
		e.Timeout != 15*time.Minute || !e.Quick || e.Line != 2 || e.on("host") || !e.on("6.12") ||
		!slices.Equal(e.Known, []string{"6.12"}) {
		t.Errorf("first entry %+v", e)
	}
	e = es[1]
	if e.Pkg != "./datapath/steer" || e.Run != "." || e.Skip != "^TestPrioBulkQuiet$" || !slices.Equal(e.Kernels, matrix) || e.Timeout != defaultTimeout || e.Quick {
		t.Errorf("second entry %+v", e)
	}
	for _, bad := range []string{
		"./control",
		"control .",
		"./control ( ",
		"./control . kernels=5.10",
		"./control . timeout=soon",
		"./control . fast",
		"./control . known=4.19",
		"./control . skip=(",
	} {
		if _, err := parseSuite(strings.NewReader(bad), "suite"); err == nil {
			t.Errorf("%q: no error", bad)
		} else if !strings.HasPrefix(err.Error(), "suite:1: ") {
			t.Errorf("%q: error %q does not name the line", bad, err)
		}
	}
}

// The suite shipped with the harness parses.
func TestShippedSuite(t *testing.T) {
	f, err := os.Open("../suite")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es, err := parseSuite(f, "suite")
	if err != nil {
		t.Fatal(err)
	}
	quick := 0
	for _, e := range es {
		if _, err := os.Stat("../../../" + e.Pkg); err != nil {
			t.Errorf("line %d: package %s: %v", e.Line, e.Pkg, err)
		}
		if e.Quick {
			quick++
		}
	}
	if quick == 0 {
		t.Error("no quick line: make test would run no guest test")
	}
}

func outcome(rs []result) map[string]string {
	m := map[string]string{}
	for _, r := range rs {
		m[r.Test] = r.Action
	}
	return m
}

func TestCollect(t *testing.T) {
	f, err := os.Open("testdata/mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := collect(f, "./x", true, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestA": "fail", "TestA/ok": "pass", "TestA/bad": "fail", "TestSkip": "skip", "TestHang": "pass"}
	if got := outcome(rs); !maps(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	if rs[0].Test != "TestA" || rs[1].Test != "TestA/ok" {
		t.Errorf("not in start order: %v", rs)
	}
	for _, r := range rs {
		switch r.Test {
		case "TestSkip":
			if r.Reason != "kernel 6.18 is built without CONFIG_NET_SCH_BPF (/proc/config.gz)" {
				t.Errorf("skip reason %q", r.Reason)
			}
		case "TestA/bad":
			if !strings.Contains(strings.Join(r.Output, "\n"), "boom") {
				t.Errorf("failure output %q lacks the error", r.Output)
			}
		}
	}
}

// A binary that panicked on its timeout: the test it was in fails, with
// the panic as its output, and so does the binary's exit.
func TestCollectTimeout(t *testing.T) {
	f, err := os.Open("testdata/timeout.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs, err := collect(f, "./x", true, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestSkip": "skip", "TestHang": "fail"}
	if got := outcome(rs); !maps(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	for _, r := range rs {
		if r.Test == "TestHang" && (r.Reason != "started and never ended" || !strings.Contains(strings.Join(r.Output, "\n"), "test timed out")) {
			t.Errorf("TestHang: reason %q, output %q", r.Reason, r.Output)
		}
	}
}

// A guest that died: every test that passed still counts, and the run is
// a failure of its own.
func TestCollectNeverEnded(t *testing.T) {
	in := `{"Action":"run","Test":"TestA"}
{"Action":"pass","Test":"TestA"}
{"Action":"run","Test":"TestB"}
{"Action":"output","Test":"TestB","Output":"    b_test.go:3: step 1\n"}
`
	rs, err := collect(strings.NewReader(in), "./x", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestA": "pass", "TestB": "fail", "./x": "fail"}
	if got := outcome(rs); !maps(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	// Exit 0 and nothing matched: a pattern that names no test is a
	// mistake, not a pass.
	rs, err = collect(strings.NewReader(`{"Action":"output","Output":"testing: warning: no tests to run\n"}`), "./x", true, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rs); !maps(got, map[string]string{"./x": "fail"}) {
		t.Errorf("no test run: outcomes %v", got)
	}
	// Exit non-zero with no failed test (a leak check in TestMain).
	rs, _ = collect(strings.NewReader(`{"Action":"run","Test":"TestA"}
{"Action":"pass","Test":"TestA"}
{"Action":"output","Output":"namespaces left behind: [x]\n"}
`), "./x", true, 1)
	if got := outcome(rs); !maps(got, map[string]string{"TestA": "pass", "./x": "fail"}) {
		t.Errorf("exit 1: outcomes %v", got)
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestSkipReason(t *testing.T) {
	for in, want := range map[string]string{
		"    x_test.go:4: no BPF qdisc\n": "no BPF qdisc",
		"no BPF qdisc":                    "no BPF qdisc",
		"    a b.go:1: c":                 "a b.go:1: c",
	} {
		if got := skipReason(in); got != want {
			t.Errorf("skipReason(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPanicLines: a guest console with a kernel panic (a 6.12 guest's
// double fault, docs/vm.md) gives the oops, where and the panic; one
// without gives nothing, so nothing boots again.
func TestPanicLines(t *testing.T) {
	b, err := os.ReadFile("testdata/panic-console.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := panicLines(string(b))
	if len(got) != 3 || !strings.Contains(got[0], "Oops: double fault") || !strings.Contains(got[1], "RIP: 0010:finish_task_switch") || !strings.Contains(got[2], "Kernel panic - not syncing") {
		t.Errorf("panic lines %q", got)
	}
	if got := panicLines("vmtest: ok\n[ 1.0] Oops: something\n"); got != nil {
		t.Errorf("no panic, and lines %q", got)
	}
}
