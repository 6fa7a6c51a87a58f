package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// harnessEnv makes the test binary play vmtest's harness (the value says
// how it ends), running standIn as its guest through the real launch path
// (runner.logged, under guarded).
const (
	harnessEnv = "LANES_VMTEST_HARNESS"
	markEnv    = "LANES_VMTEST_MARK"
)

func TestMain(m *testing.M) {
	if os.Getenv(reapEnv) != "" {
		os.Exit(reapMain(os.Args[1:]))
	}
	if mode := os.Getenv(harnessEnv); mode != "" {
		os.Exit(harnessMain(mode))
	}
	os.Exit(m.Run())
}

// standIn behaves as run.sh does to its guest: it starts a child that
// moves to a session (and process group) of its own, as timeout does,
// which starts a long-running grandchild, as vng starts QEMU; and a
// child of its own. Each shell says it is ready (INNER, READY) once it
// has started its children, and it ends by itself once GO (a FIFO) is
// opened for writing: it waits without starting a process, so that the
// processes the test counts are these alone.
const standIn = `
setsid sh -c 'sleep 1000 & : > "$DIR/INNER"; wait' &
sleep 1000 &
: > "$DIR/READY"
: < "$DIR/GO"
`

func harnessMain(mode string) int {
	dir := os.Getenv("DIR")
	return guarded(func() int {
		r := &runner{}
		done := make(chan error, 1)
		pidns := os.Getenv("PIDNS") != ""
		go func() { done <- r.logged(filepath.Join(dir, "console"), exec.Command("sh", "-c", standIn), pidns) }()
		if mode == "panic" {
			for !exists(filepath.Join(dir, "PANIC")) {
				time.Sleep(10 * time.Millisecond)
			}
			panic("the harness panics with its guest running")
		}
		if err := <-done; err != nil {
			fmt.Fprintln(os.Stderr, "guest:", err)
		}
		return 0
	})
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// marked lists the live processes whose environment holds mark: the
// harness and everything it started, however deep or regrouped.
func marked(mark string) []int {
	return procsWhere("environ", func(env []byte) bool {
		return bytes.Contains(env, []byte("\x00"+markEnv+"="+mark+"\x00"))
	})
}

// Whatever ends vmtest's harness (SIGTERM, which make passes on, SIGINT,
// SIGKILL, the harness and its reaper killed at once, a panic) or its
// guest's command (run.sh's own timeout), no process of the guest's tree
// is left running: not the grandchild in a session of its own either.
func TestGuestsEndWithHarness(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type how struct {
		name, mode string // mode: harnessEnv's
		end        func(h *exec.Cmd, dir string)
		pidnsOnly  bool
	}
	sig := func(s syscall.Signal) func(*exec.Cmd, string) {
		return func(h *exec.Cmd, _ string) { h.Process.Signal(s) }
	}
	cases := []how{
		{"SIGTERM", "run", sig(syscall.SIGTERM), false},
		{"SIGINT", "run", sig(syscall.SIGINT), false},
		{"SIGKILL", "run", sig(syscall.SIGKILL), false},
		{"guest command ends", "run", func(_ *exec.Cmd, dir string) { os.WriteFile(filepath.Join(dir, "GO"), nil, 0o644) }, false},
		{"panic", "panic", func(_ *exec.Cmd, dir string) { os.WriteFile(filepath.Join(dir, "PANIC"), nil, 0o644) }, false},
		// The whole process group, harness and reaper together, as a
		// timeout's second signal sends it: only a PID namespace holds.
		{"SIGKILL to the process group", "run", func(h *exec.Cmd, _ string) { syscall.Kill(-h.Process.Pid, syscall.SIGKILL) }, true},
	}
	for _, pidns := range []bool{false, true} {
		if pidns && os.Geteuid() != 0 {
			t.Log("without root the guest gets no PID namespace: its cases are left out")
			continue
		}
		for _, c := range cases {
			if c.pidnsOnly && !pidns {
				continue
			}
			t.Run(fmt.Sprintf("%s/pidns=%v", c.name, pidns), func(t *testing.T) {
				dir := t.TempDir()
				mark := fmt.Sprintf("%d-%s", os.Getpid(), filepath.Base(dir))
				if err := syscall.Mkfifo(filepath.Join(dir, "GO"), 0o600); err != nil {
					t.Fatal(err)
				}
				h := exec.Command(self)
				h.Env = append(os.Environ(), harnessEnv+"="+c.mode, markEnv+"="+mark, "DIR="+dir)
				if pidns {
					h.Env = append(h.Env, "PIDNS=1")
				}
				h.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := h.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					for _, p := range marked(mark) {
						syscall.Kill(p, syscall.SIGKILL)
					}
				})
				exited := make(chan error, 1)
				go func() { exited <- h.Wait() }()
				for _, m := range []string{"READY", "INNER"} {
					if !waitFor(func() bool { return exists(filepath.Join(dir, m)) }) {
						t.Fatalf("premise: the stand-in guest never said %s", m)
					}
				}
				// harness, reaper, sh, setsid'd sh, its sleep, the sleep
				if n := len(marked(mark)); n < 6 {
					t.Fatalf("premise: %d processes of the harness's tree run, want at least 6", n)
				}
				c.end(h, dir)
				select {
				case <-exited:
				case <-time.After(time.Minute):
					t.Fatal("the harness did not end")
				}
				if !waitFor(func() bool { return len(marked(mark)) == 0 }) {
					t.Errorf("processes of the guest's tree left running: %v", marked(mark))
				}
			})
		}
	}
}

// waitFor polls cond for up to a minute.
func waitFor(cond func() bool) bool {
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
