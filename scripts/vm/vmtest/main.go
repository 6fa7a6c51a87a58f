// Command vmtest runs lanes' guest tests on a matrix of kernels and
// reports each test's result on the host: this machine's kernel (the test
// binaries run here, nothing booted), Debian's 6.12 and the newest Debian
// kernel (each booted with virtme-ng under QEMU's TCG by scripts/vm/run.sh,
// the binaries run inside). Which tests run on which kernel is the suite
// file's (scripts/vm/suite); -pkg and -run name one test instead.
//
//	go run ./scripts/vm/vmtest                      # the whole matrix
//	go run ./scripts/vm/vmtest -quick -kernels 6.12,newest   # make test's part
//	go run ./scripts/vm/vmtest -kernels newest -pkg ./policy/mflow -run TestX
//
// It builds each package's test binary on the host (go test -c), runs the
// binaries with -test.v=test2json, turns their output into results with
// go tool test2json, prints one "--- PASS|FAIL|SKIP: name (kernel R)" line
// per test and subtest, a count per kernel and in all, and exits 1 when a
// test failed. A kernel that cannot be had (no network for its first
// fetch, no QEMU) is reported as "kernel K: skipped: why", and fails the run
// only with -require. Outputs stay in -out (default out/vm): per kernel
// the guest's console, each binary's raw output and exit status.
//
// Under TCG only counts are evidence (datagrams received, out of order,
// held, gaps); a time a test takes or measures in a guest is not.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/kver"
)

// hostLock is the lock the root integration tests on this machine share
// (flock, exclusive): they share one kernel, so a run on the host waits
// for whoever holds it (docs/vm.md).
const hostLock = "/tmp/lanes-itest.lock"

// bootMargin is what a guest may take beyond its tests' timeouts: the
// boot (about a minute under TCG on a loaded machine) and the shutdown.
const bootMargin = 5 * time.Minute

type counts struct{ pass, fail, skip, known int }

func (c *counts) add(a string, known bool) {
	switch {
	case a == "pass":
		c.pass++
	case a == "fail" && known:
		c.known++
	case a == "fail":
		c.fail++
	case a == "skip":
		c.skip++
	}
}

func (c *counts) sum(o counts) {
	c.pass += o.pass
	c.fail += o.fail
	c.skip += o.skip
	c.known += o.known
}

func (c counts) String() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", c.pass, c.fail, c.skip)
}

func main() {
	if os.Getenv(reapEnv) != "" {
		os.Exit(reapMain(os.Args[1:]))
	}
	var (
		guest   = flag.String("guest", "", "`PLAN`: run a plan's test binaries (inside a guest; used by vmtest itself)")
		kernels = flag.String("kernels", strings.Join(matrix, ","), "the `kernels` to run on, of "+strings.Join(matrix, ", "))
		quick   = flag.Bool("quick", false, "only the suite's quick lines (make test's guest part)")
		suite   = flag.String("suite", "scripts/vm/suite", "the suite `file`")
		pkg     = flag.String("pkg", "", "run this `package` (./dir) instead of the suite")
		run     = flag.String("run", ".", "with -pkg: the -test.run `pattern`")
		timeout = flag.Duration("timeout", defaultTimeout, "with -pkg: the -test.timeout")
		out     = flag.String("out", "out/vm", "output `directory`")
		require = flag.Bool("require", false, "a kernel that cannot be had fails the run")
		verbose = flag.Bool("v", false, "print the guest's whole console as it runs")
	)
	flag.Parse()
	if *guest != "" {
		os.Exit(guestMain(*guest))
	}
	if flag.NArg() > 0 {
		fail("unexpected arguments %q: options only (see -h)", flag.Args())
	}
	ks := strings.Split(*kernels, ",")
	for _, k := range ks {
		if !slices.Contains(matrix, k) {
			fail("kernel %q: the matrix has %s", k, strings.Join(matrix, ", "))
		}
	}
	root, err := repoRoot()
	if err != nil {
		fail("%v", err)
	}
	if err := os.Chdir(root); err != nil {
		fail("%v", err)
	}
	var es []entry
	if *pkg != "" {
		es = []entry{{Pkg: *pkg, Run: *run, Kernels: matrix, Timeout: *timeout}}
	} else {
		f, err := os.Open(*suite)
		if err != nil {
			fail("%v", err)
		}
		es, err = parseSuite(f, *suite)
		f.Close()
		if err != nil {
			fail("%v", err)
		}
		if *quick {
			es = slices.DeleteFunc(es, func(e entry) bool { return !e.Quick })
		}
	}
	r := &runner{root: root, verbose: *verbose}
	if r.out, err = filepath.Abs(*out); err != nil {
		fail("%v", err)
	}
	os.Exit(guarded(func() int { return r.matrix(ks, es, *require) }))
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "vm-test: "+format+"\n", a...)
	os.Exit(2)
}

type runner struct {
	root, out string
	verbose   bool
	bins      map[string]string // package -> test binary
	self      string            // this program, copied where a guest can run it
}

func (r *runner) matrix(ks []string, es []entry, require bool) int {
	start := time.Now()
	var total counts
	var skipped []string
	for _, k := range ks {
		var mine []entry
		for _, e := range es {
			if e.on(k) {
				mine = append(mine, e)
			}
		}
		if len(mine) == 0 {
			continue
		}
		c, err := r.kernel(k, mine)
		if err != nil {
			var sk skip
			if errors.As(err, &sk) {
				fmt.Printf("vm-test: kernel %s: skipped: %s\n", k, sk.why)
				skipped = append(skipped, k)
				continue
			}
			fmt.Printf("vm-test: kernel %s: %v\n", k, err)
			total.fail++
			continue
		}
		total.sum(c)
	}
	if len(skipped) > 0 {
		fmt.Printf("vm-test: kernels skipped: %s\n", strings.Join(skipped, ", "))
	}
	if total.known > 0 {
		fmt.Printf("vm-test: %d known failures (marked known= in the suite; docs/vm.md says why), not counted below\n", total.known)
	}
	note := ""
	if slices.ContainsFunc(ks, func(k string) bool { return k != "host" && !slices.Contains(skipped, k) }) {
		note = " (under TCG only counts are evidence, never times)"
	}
	fmt.Printf("vm-test: done in %s%s\n", time.Since(start).Round(time.Second), note)
	if total == (counts{}) {
		// No count line of zeros: it would read as a run that tested
		// nothing and passed.
		fmt.Println("vm-test: no test ran")
	} else {
		fmt.Printf("vm-test: %s\n", total)
	}
	if total.fail > 0 || (require && len(skipped) > 0) {
		return 1
	}
	return 0
}

// skip is a kernel that cannot be had here.
type skip struct{ why string }

func (s skip) Error() string { return s.why }

// kernel runs entries on one kernel of the matrix and prints their results.
func (r *runner) kernel(k string, es []entry) (counts, error) {
	dir := filepath.Join(r.out, k)
	if err := os.RemoveAll(dir); err != nil {
		return counts{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return counts{}, err
	}
	var vmlinuz string
	if k != "host" {
		var err error
		if vmlinuz, err = r.fetch(k); err != nil {
			return counts{}, err
		}
	}
	if err := r.build(es); err != nil {
		return counts{}, err
	}
	p := plan{Kernel: k, Out: dir}
	var wall time.Duration
	for i, e := range es {
		p.Items = append(p.Items, item{
			Name:    fmt.Sprintf("%02d-%s", i+1, strings.ReplaceAll(strings.TrimPrefix(e.Pkg, "./"), "/", "_")),
			Pkg:     e.Pkg,
			Dir:     filepath.Join(r.root, e.Pkg),
			Bin:     r.bins[e.Pkg],
			Run:     e.Run,
			Skip:    e.Skip,
			Timeout: e.Timeout,
			Known:   slices.Contains(e.Known, k),
		})
		wall += e.Timeout + hardMargin
	}
	planFile := filepath.Join(dir, "plan.json")
	b, _ := json.MarshalIndent(p, "", "  ")
	if err := os.WriteFile(planFile, b, 0o644); err != nil {
		return counts{}, err
	}
	console := filepath.Join(dir, "console.log")
	if k == "host" {
		rel, _ := kver.Release()
		fmt.Printf("vm-test: kernel host (%s): running %d test binaries here\n", rel, len(p.Items))
		unlock, err := lockHost()
		if err != nil {
			return counts{}, err
		}
		err = r.logged(console, exec.Command(r.self, "-guest", planFile), false)
		unlock()
		if err != nil {
			return counts{}, err
		}
	} else {
		// A guest kernel that panics (docs/vm.md) says nothing of the
		// tests it cut short: they run again, once, in a fresh boot,
		// and the panic is printed. A second panic fails them.
		for boot := 1; ; boot++ {
			fmt.Printf("vm-test: kernel %s: booting %s under TCG for %d test binaries\n", k, vmlinuz, len(p.Items))
			cmd := exec.Command(filepath.Join(r.root, "scripts/vm/run.sh"), "--kernel", k, "--out", dir, "--console",
				"--timeout", fmt.Sprint(int((wall + bootMargin).Seconds())), "--", r.self, "-guest", planFile)
			if err := r.logged(console, cmd, true); err != nil {
				var ee *exec.ExitError
				if !errors.As(err, &ee) {
					return counts{}, err
				}
				// The results say what ended early; the console says why.
				fmt.Printf("vm-test: kernel %s: the guest exited %d (console: %s)\n", k, ee.ExitCode(), console)
			}
			crash := panicLines(readFile(console))
			if boot == 2 || len(crash) == 0 || allEnded(p, dir) {
				break
			}
			fmt.Printf("vm-test: kernel %s: the guest kernel panicked, cutting the tests short; they run again, once, in a fresh boot:\n", k)
			for _, l := range crash {
				fmt.Println("        " + l)
			}
			if err := os.Rename(console, console+".panic"); err != nil {
				return counts{}, err
			}
			for _, it := range p.Items {
				os.Remove(it.outFile(dir))
				os.Remove(it.rcFile(dir))
			}
		}
	}
	rel := strings.TrimSpace(readFile(filepath.Join(dir, "kernel")))
	if rel == "" {
		rel = k + ", never started"
	}
	var c counts
	for _, it := range p.Items {
		rc, ended := readRC(it.rcFile(dir))
		res, err := r.results(it, dir, ended, rc)
		if err != nil {
			return c, err
		}
		if !ended && len(res) == 1 && len(res[0].Output) == 0 {
			res[0].Output = tail(console, keepLines)
		}
		// A binary the guest never ran or never finished is no known
		// failure, whatever its line says.
		known := it.Known && ended
		for _, x := range res {
			c.add(x.Action, known)
			line := fmt.Sprintf("--- %s: %s (kernel %s)", strings.ToUpper(x.Action), x.Test, rel)
			if x.Reason != "" {
				line += ": " + x.Reason
			}
			if x.Action == "fail" && known {
				line += " [known on " + k + "]"
			}
			fmt.Println(line)
			if x.Action == "fail" {
				for _, o := range x.Output {
					fmt.Println("        " + strings.TrimRight(o, "\n"))
				}
			}
		}
	}
	known := ""
	if c.known > 0 {
		known = fmt.Sprintf(", %d known failures", c.known)
	}
	fmt.Printf("vm-test: kernel %s (%s): %s%s\n", k, rel, c, known)
	return c, nil
}

// panicLines are the lines of a guest console that say how its kernel
// panicked (the oops, where, the panic), nil when it did not panic.
func panicLines(console string) []string {
	if !strings.Contains(console, "Kernel panic - not syncing") {
		return nil
	}
	var out []string
	for _, l := range strings.Split(console, "\n") {
		if strings.Contains(l, "Kernel panic - not syncing") || strings.Contains(l, "Oops:") || strings.Contains(l, "RIP:") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return clip(out)
}

// allEnded says whether every item of p left its exit status in dir.
func allEnded(p plan, dir string) bool {
	for _, it := range p.Items {
		if _, ended := readRC(it.rcFile(dir)); !ended {
			return false
		}
	}
	return true
}

// results reads one binary's output through go tool test2json.
func (r *runner) results(it item, dir string, ended bool, rc int) ([]result, error) {
	raw, err := os.ReadFile(it.outFile(dir))
	if err != nil {
		return []result{{Test: it.Pkg, Action: "fail", Reason: "never run (the guest ended before it)"}}, nil
	}
	cmd := exec.Command(goTool(), "tool", "test2json", "-p", it.Pkg)
	cmd.Stdin = bytes.NewReader(raw)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go tool test2json: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return collect(&stdout, it.Pkg, ended, rc)
}

// fetch brings kernel k into the cache; a failure is a skip.
func (r *runner) fetch(k string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(r.root, "scripts/vm/fetch.sh"), k)
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		why := lines[len(lines)-1]
		if why == "" {
			why = err.Error()
		}
		return "", skip{"cannot fetch it: " + strings.TrimPrefix(why, "fetch: ")}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "", skip{"no qemu-system-x86_64: run make deps (scripts/vm/deps.sh)"}
	}
	if !vngInstalled() {
		return "", skip{"no virtme-ng: run make deps (scripts/vm/deps.sh)"}
	}
	return strings.TrimSpace(string(b)), nil
}

func vngInstalled() bool {
	if v := os.Getenv("LANES_VNG"); v != "" {
		return true
	}
	if _, err := os.Stat("/opt/lanes-vng/bin/vng"); err == nil {
		return true
	}
	_, err := exec.LookPath("vng")
	return err == nil
}

// build makes the test binaries the entries need (once per package) and a
// copy of this program beside them.
func (r *runner) build(es []entry) error {
	bin := filepath.Join(r.out, "bin")
	if r.bins == nil {
		r.bins = map[string]string{}
		if err := os.RemoveAll(bin); err != nil {
			return err
		}
		if err := os.MkdirAll(bin, 0o755); err != nil {
			return err
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		r.self = filepath.Join(bin, "vmtest")
		if err := copyFile(self, r.self); err != nil {
			return err
		}
	}
	for _, e := range es {
		if _, ok := r.bins[e.Pkg]; ok {
			continue
		}
		b := filepath.Join(bin, strings.ReplaceAll(strings.TrimPrefix(e.Pkg, "./"), "/", "_")+".test")
		cmd := exec.Command(goTool(), "test", "-c", "-o", b, e.Pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go test -c %s: %v", e.Pkg, err)
		}
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("go test -c %s made no binary (no test files?)", e.Pkg)
		}
		r.bins[e.Pkg] = b
	}
	return nil
}

// logged runs cmd under a reaper (runReaped; in a PID namespace of its
// own with pidns) with its output in file, and on stdout the harness's
// own lines (or everything, with -v).
func (r *runner) logged(file string, cmd *exec.Cmd, pidns bool) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer f.Close()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 0, 4096)
		chunk := make([]byte, 4096)
		for {
			n, err := pr.Read(chunk)
			f.Write(chunk[:n])
			buf = append(buf, chunk[:n]...)
			for {
				i := bytes.IndexByte(buf, '\n')
				if i < 0 {
					break
				}
				line := string(buf[:i])
				buf = buf[i+1:]
				if r.verbose || strings.HasPrefix(line, "run: ") || strings.HasPrefix(line, "vmtest: ") {
					fmt.Println("  " + line)
				}
			}
			if err != nil {
				return
			}
		}
	}()
	err = runReaped(cmd, pidns)
	pw.Close()
	<-done
	return err
}

func lockHost() (func(), error) {
	f, err := os.OpenFile(hostLock, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		fmt.Printf("vm-test: waiting for %s (other integration tests run)\n", hostLock)
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			f.Close()
			return nil, err
		}
	}
	return func() { f.Close() }, nil
}

func goTool() string {
	if g := os.Getenv("GO"); g != "" {
		return g
	}
	return "go"
}

func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "scripts/vm/run.sh")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("run it inside the lanes checkout (no scripts/vm/run.sh above this directory)")
		}
		d = parent
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}
