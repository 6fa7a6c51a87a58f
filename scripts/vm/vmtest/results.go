package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// event is one line of `go tool test2json` output.
type event struct {
	Action string
	Test   string
	Output string
}

// result is one test's (or subtest's) outcome on one kernel.
type result struct {
	Test   string
	Action string   // pass, fail or skip
	Reason string   // why a test was skipped, or how a run ended without a result
	Output []string // the test's last output lines, for a failure
}

// A failure shows at most keepLines of its output: the first keepHead
// (a panic's message) and the last ones (where it ended).
const (
	keepLines = 20
	keepHead  = 6
	elided    = "        ..."
)

// clip drops lines from the middle of lines beyond keepLines, marking the
// gap once.
func clip(lines []string) []string {
	if len(lines) <= keepLines {
		return lines
	}
	head := lines[:keepHead]
	rest := lines[keepHead:]
	if rest[0] == elided {
		rest = rest[1:]
	}
	rest = rest[len(rest)-(keepLines-keepHead-1):]
	return append(append(append([]string{}, head...), elided), rest...)
}

// collect turns one test binary's test2json events into results, in the
// order the tests started. A test that started and never ended fails (the
// binary panicked, timed out or the guest died); so does a binary that
// exited non-zero with no failed test, and one that never ended (ended is
// false: no exit status was written) even if every test it started passed.
func collect(r io.Reader, pkg string, ended bool, rc int) ([]result, error) {
	var order []string
	byName := map[string]*result{}
	var pkgOut []string
	get := func(name string) *result {
		if res, ok := byName[name]; ok {
			return res
		}
		res := &result{Test: name}
		byName[name] = res
		order = append(order, name)
		return res
	}
	keep := func(lines []string, s string) []string {
		s = strings.TrimRight(s, "\n")
		if s == "" {
			return lines
		}
		return clip(append(lines, s))
	}
	dec := json.NewDecoder(r)
	for {
		var ev event
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: test2json output: %w", pkg, err)
		}
		if ev.Test == "" {
			if ev.Action == "output" {
				pkgOut = keep(pkgOut, ev.Output)
			}
			continue
		}
		res := get(ev.Test)
		switch ev.Action {
		case "output":
			o := strings.TrimSpace(ev.Output)
			// The result lines test2json passes through as output.
			if strings.HasPrefix(o, "=== ") || strings.HasPrefix(o, "--- ") {
				continue
			}
			res.Output = keep(res.Output, ev.Output)
		case "pass", "fail", "skip":
			res.Action = ev.Action
		}
	}
	var out []result
	failed := false
	for _, name := range order {
		res := byName[name]
		switch res.Action {
		case "":
			res.Action = "fail"
			res.Reason = "started and never ended"
			if len(res.Output) == 0 {
				res.Output = pkgOut
			}
		case "skip":
			if n := len(res.Output); n > 0 {
				res.Reason = skipReason(res.Output[n-1])
			}
		}
		if res.Action == "fail" {
			failed = true
		}
		out = append(out, *res)
	}
	switch {
	case !ended:
		out = append(out, result{Test: pkg, Action: "fail", Reason: "the run never ended (the guest died or timed out during it)", Output: pkgOut})
	case rc != 0 && !failed:
		out = append(out, result{Test: pkg, Action: "fail", Reason: fmt.Sprintf("the test binary exited %d", rc), Output: pkgOut})
	case rc == 0 && len(order) == 0:
		out = append(out, result{Test: pkg, Action: "fail", Reason: "no test matched the pattern", Output: pkgOut})
	}
	return out, nil
}

// skipReason strips the "file.go:12: " prefix testing puts before a
// message.
func skipReason(line string) string {
	line = strings.TrimSpace(line)
	if file, rest, ok := strings.Cut(line, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
		return rest
	}
	return line
}

// readRC reads NAME.rc: the binary's exit status, and whether it ended.
func readRC(path string) (rc int, ended bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	rc, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false
	}
	return rc, true
}

// tail is the last n lines of a file, for a guest that ended early.
func tail(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}
