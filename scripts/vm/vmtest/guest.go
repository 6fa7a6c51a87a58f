package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lanesnet/lanes/internal/kver"
)

// plan is what the driver runs on one kernel: test binaries built on the
// host, each run in its package's directory, its output and exit status
// written to Out (a directory the host reads after the guest is gone).
type plan struct {
	Kernel string
	Out    string
	Items  []item
}

type item struct {
	Name    string // file stem of its output in Out
	Pkg     string // ./dir
	Dir     string // the package's directory (the binary's working directory)
	Bin     string
	Run     string
	Skip    string
	Timeout time.Duration
	Known   bool // its failures on this kernel are known
}

func (it item) outFile(dir string) string { return filepath.Join(dir, it.Name+".out") }
func (it item) rcFile(dir string) string  { return filepath.Join(dir, it.Name+".rc") }

// hardMargin is how long a test binary may run past its -test.timeout
// (which makes it panic with every goroutine's stack) before it is killed.
const hardMargin = time.Minute

// runPlan runs each item's test binary in turn with -test.v=test2json,
// writing NAME.out (stdout and stderr) and then NAME.rc (the exit status;
// its absence means the run never ended: the guest died during it).
// Progress lines go to stdout.
func runPlan(p plan) error {
	rel, err := kver.Release()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.Out, "kernel"), []byte(rel+"\n"), 0o644); err != nil {
		return err
	}
	for _, it := range p.Items {
		fmt.Printf("vmtest: %s: %s -test.run %s\n", rel, it.Pkg, it.Run)
		rc := runItem(it, p.Out)
		fmt.Printf("vmtest: %s: %s exit %d\n", rel, it.Pkg, rc)
	}
	return nil
}

func runItem(it item, out string) int {
	f, err := os.Create(it.outFile(out))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return -1
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), it.Timeout+hardMargin)
	defer cancel()
	args := []string{"-test.v=test2json", "-test.count=1", "-test.run", it.Run, "-test.timeout", it.Timeout.String()}
	if it.Skip != "" {
		args = append(args, "-test.skip", it.Skip)
	}
	cmd := exec.CommandContext(ctx, it.Bin, args...)
	cmd.Dir = it.Dir
	cmd.Stdout, cmd.Stderr = f, f
	rc := 0
	if err := cmd.Run(); err != nil {
		rc = -1
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() >= 0 {
			rc = ee.ExitCode()
		} else {
			fmt.Fprintf(f, "\nvmtest: %v\n", err)
		}
	}
	f.Sync()
	if err := os.WriteFile(it.rcFile(out), []byte(strconv.Itoa(rc)+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return rc
}

func guestMain(planFile string) int {
	b, err := os.ReadFile(planFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var p plan
	if err := json.Unmarshal(b, &p); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", planFile, err)
		return 1
	}
	if err := runPlan(p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
