package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The kernels of the matrix, in the order they run: this machine's own
// (no guest), Debian's 6.12, the newest Debian kernel.
var matrix = []string{"host", "6.12", "newest"}

const defaultTimeout = 10 * time.Minute

// entry is one line of the suite file: a package's test binary run with
// one -test.run pattern on some of the matrix's kernels.
type entry struct {
	Pkg     string
	Run     string
	Skip    string // -test.skip pattern: tests that cannot run in a guest
	Kernels []string
	Timeout time.Duration
	Quick   bool
	Known   []string // kernels on which its failures are known (reported, not counted as failures)
	Line    int
}

func (e entry) on(kernel string) bool { return slices.Contains(e.Kernels, kernel) }

// parseSuite reads the suite file (format in scripts/vm/suite).
func parseSuite(r io.Reader, name string) ([]entry, error) {
	var es []entry
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", name, n, fmt.Sprintf(format, a...))
		}
		if len(f) < 2 {
			return nil, bad("want PACKAGE RUN-PATTERN [kernels=..] [timeout=..] [skip=..] [known=..] [quick]")
		}
		e := entry{Pkg: f[0], Run: f[1], Kernels: matrix, Timeout: defaultTimeout, Line: n}
		if !strings.HasPrefix(e.Pkg, "./") {
			return nil, bad("package %q: give it as ./dir", e.Pkg)
		}
		if _, err := regexp.Compile(e.Run); err != nil {
			return nil, bad("pattern %q: %v", e.Run, err)
		}
		for _, o := range f[2:] {
			k, v, _ := strings.Cut(o, "=")
			switch k {
			case "kernels":
				e.Kernels = strings.Split(v, ",")
				for _, kk := range e.Kernels {
					if !slices.Contains(matrix, kk) {
						return nil, bad("kernel %q: the matrix has %s", kk, strings.Join(matrix, ", "))
					}
				}
			case "timeout":
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return nil, bad("timeout %q: give a duration like 10m", v)
				}
				e.Timeout = d
			case "skip":
				if _, err := regexp.Compile(v); err != nil || v == "" {
					return nil, bad("skip pattern %q: want a regular expression", v)
				}
				e.Skip = v
			case "known":
				e.Known = strings.Split(v, ",")
				for _, kk := range e.Known {
					if !slices.Contains(matrix, kk) {
						return nil, bad("kernel %q: the matrix has %s", kk, strings.Join(matrix, ", "))
					}
				}
			case "quick":
				e.Quick = true
			default:
				return nil, bad("unknown option %q (kernels=, timeout=, skip=, known=, quick)", o)
			}
		}
		es = append(es, e)
	}
	return es, sc.Err()
}
