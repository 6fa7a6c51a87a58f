package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A guest is a tree of processes vmtest does not see whole: run.sh starts
// timeout, which moves to a process group of its own, which starts vng,
// which starts QEMU. vmtest therefore runs each guest (and the host
// kernel's test binaries) under a reaper, vmtest itself started with
// reapEnv set, and ends the reaper's whole tree on every way vmtest can
// end:
//
//   - a guest, as root, has the reaper for the init of a new PID
//     namespace, so the kernel kills every process in it the moment the
//     reaper exits, however they regrouped; the reaper dies with vmtest
//     (Pdeathsig SIGKILL), also when vmtest is killed with SIGKILL or
//     crashes, and when both are killed at once;
//   - otherwise (no root, or the host kernel's tests, which must see the
//     host's PIDs: they read /proc and name namespaces by PID) it is a
//     child subreaper: orphans of the tree become its children, and it
//     kills every one of them when its command ends or when vmtest dies
//     (Pdeathsig SIGTERM);
//   - vmtest ends its reapers on SIGINT, SIGTERM and SIGHUP, and on a
//     panic of its main goroutine, then exits 1;
//   - vmtest itself gets SIGTERM when its parent dies (`go run` dies of
//     the SIGTERM make passes on, and would leave vmtest running).
const reapEnv = "LANES_VMTEST_REAP"

// reaped returns cmd run under a reaper: the same command, directory,
// environment and output; in a PID namespace of its own where pidns and
// root allow it.
func reaped(cmd *exec.Cmd, pidns bool) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	w := exec.Command(self, cmd.Args...)
	w.Args[1] = cmd.Path
	w.Dir, w.Stdin, w.Stdout, w.Stderr = cmd.Dir, cmd.Stdin, cmd.Stdout, cmd.Stderr
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	w.Env = append(env[:len(env):len(env)], reapEnv+"=1")
	w.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if pidns && os.Geteuid() == 0 {
		w.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Cloneflags: syscall.CLONE_NEWPID}
	}
	return w, nil
}

// guests are the reapers running, which stopGuests ends.
var guests = struct {
	sync.Mutex
	m       map[*exec.Cmd]bool
	stopped bool
}{m: map[*exec.Cmd]bool{}}

// runReaped runs cmd under a reaper until it ends, or until stopGuests.
// The thread that started the reaper stays until it ends: Pdeathsig
// follows the thread, not the process.
func runReaped(cmd *exec.Cmd, pidns bool) error {
	w, err := reaped(cmd, pidns)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	guests.Lock()
	if guests.stopped {
		guests.Unlock()
		return errors.New("vm-test is stopping")
	}
	if err := w.Start(); err != nil {
		guests.Unlock()
		return err
	}
	guests.m[w] = true
	guests.Unlock()
	err = w.Wait()
	guests.Lock()
	delete(guests.m, w)
	stopping := guests.stopped
	guests.Unlock()
	if stopping {
		select {} // guardProcess exits; no result of a guest it ended
	}
	return err
}

// stopGuests ends every reaper and what runs under it, and waits for
// them; no guest starts after it.
func stopGuests() {
	guests.Lock()
	guests.stopped = true
	var ws []*exec.Cmd
	for w := range guests.m {
		ws = append(ws, w)
	}
	guests.Unlock()
	for _, w := range ws {
		sig := syscall.SIGKILL // the namespace's init: the kernel ends the rest
		if w.SysProcAttr.Cloneflags&syscall.CLONE_NEWPID == 0 {
			sig = syscall.SIGTERM // the reaper kills its tree, then exits
		}
		w.Process.Signal(sig)
	}
	for {
		guests.Lock()
		n := len(guests.m)
		guests.Unlock()
		if n == 0 {
			return
		}
		runtime.Gosched()
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
	}
}

// guarded runs f, the harness's work, under guardProcess, and ends the
// guests before a panic of f goes on.
func guarded(f func() int) int {
	guardProcess()
	defer func() {
		if p := recover(); p != nil {
			stopGuests()
			panic(p)
		}
	}()
	return f()
}

// guardProcess makes vmtest end its guests and exit 1 on SIGINT, SIGTERM
// and SIGHUP, and get SIGTERM when its parent dies.
func guardProcess() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	parent := os.Getppid()
	unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0)
	if os.Getppid() != parent {
		ch <- syscall.SIGTERM // the parent died before the prctl
	}
	go func() {
		s := <-ch
		fmt.Fprintf(os.Stderr, "vm-test: %v: ending the guests\n", s)
		stopGuests()
		fmt.Fprintf(os.Stderr, "vm-test: stopped by %v: no guest left running\n", s)
		os.Exit(1)
	}()
}

// reapMain is vmtest started as a reaper: it runs args, passes SIGINT,
// SIGTERM and SIGHUP on to it, reaps every process left to it, and exits
// with the command's status after killing whatever of its tree is left.
func reapMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "vmtest: reaper: no command")
		return 125
	}
	os.Unsetenv(reapEnv)
	// In a PID namespace of its own the kernel ends the tree when this
	// process exits; elsewhere orphans of the tree come here.
	nsInit := os.Getpid() == 1
	if !nsInit {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintf(os.Stderr, "vmtest: reaper: %v\n", err)
			return 125
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "vmtest: reaper: %v\n", err)
		return 125
	}
	done := make(chan int, 1)
	go func() { done <- reapUntil(cmd.Process.Pid) }()
	rc := 0
	select {
	case rc = <-done:
	case s := <-sigs: // the guest ends now, whole
		rc = 128 + int(s.(syscall.Signal))
	}
	// A namespace's init leaves the killing to the kernel: its /proc is
	// the host's, whose PID 1 is not this process.
	if !nsInit {
		killTree()
	}
	return rc
}

// reapUntil waits for every child, the re-parented orphans too, until pid
// exits, and returns pid's exit status.
func reapUntil(pid int) int {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 125
		}
		if got != pid {
			continue
		}
		switch {
		case ws.Exited():
			return ws.ExitStatus()
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
	}
}

// killTree kills every child of this process until none is left (a
// subreaper gets the orphans of the dying ones as children).
func killTree() {
	self := strconv.Itoa(os.Getpid())
	for range 100 {
		kids := children(self)
		if len(kids) == 0 {
			return
		}
		for _, k := range kids {
			unix.Kill(k, unix.SIGKILL)
		}
		for _, k := range kids {
			var ws unix.WaitStatus
			unix.Wait4(k, &ws, 0, nil)
		}
	}
}

// children are the processes whose parent is ppid, from /proc.
func children(ppid string) []int {
	return procsWhere("stat", func(b []byte) bool {
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		return len(f) > 1 && f[1] == ppid
	})
}

// procsWhere lists the processes whose /proc/PID/file match says yes to.
func procsWhere(file string, match func([]byte) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/" + file); err == nil && match(b) {
			out = append(out, pid)
		}
	}
	return out
}
