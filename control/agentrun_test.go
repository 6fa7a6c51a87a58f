package control

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/lanesnet/lanes/datapath/knobs"
	"golang.org/x/sys/unix"
)

// holdAgentLock holds dir's agent lock as an agent of another process
// would (its own open file, pid written) until the test ends or release.
func holdAgentLock(t *testing.T, dir string, pid int) (release func()) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, AgentLockFile), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("premise: the agent lock is free: %v", err)
	}
	f.WriteString(strconv.Itoa(pid) + "\n")
	t.Cleanup(func() { f.Close() })
	return func() { f.Close() }
}

// Apply, reset and reset --all refuse a target whose agent runs (holds
// its lock), in one line naming its PID, and change nothing: reset --all
// resets no target while any agent runs. Once the agent is gone (its
// lock dropped, as the kernel drops a dead process's), reset works.
func TestApplyResetRefuseRunningAgent(t *testing.T) {
	stateDir := t.TempDir()
	dir := Dir(stateDir, "lanes-agentrun")
	other := Dir(stateDir, "lanes-other")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeState(other, &State{Mode: "rps", Target: "lanes-other", Phase: Applied}); err != nil {
		t.Fatal(err)
	}
	pid := os.Getppid() // a live process that is not this one
	release := holdAgentLock(t, dir, pid)
	want := "pid " + strconv.Itoa(pid)
	oneLine := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s with an agent running: %v, want one line naming pid %d", what, err, pid)
		}
	}
	_, err := Reset("lanes-agentrun", stateDir)
	oneLine("reset", err)
	_, err = ResetAll(stateDir)
	oneLine("reset --all", err)
	if _, err := os.Stat(filepath.Join(other, StateFile)); err != nil {
		t.Errorf("the refused reset --all reset another target: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, AgentLockFile)); err != nil {
		t.Errorf("the refused reset touched the target: %v", err)
	}
	_, err = holdAgentOff(dir, "apply", true)
	oneLine("apply", err)

	release()
	if _, err := ResetAll(stateDir); err != nil {
		t.Errorf("reset --all with no agent running: %v", err)
	}
	if ents, _ := os.ReadDir(stateDir); len(ents) != 0 {
		t.Errorf("state left after reset --all: %v", ents)
	}
}

// Agents started at once for one target: exactly one takes the lock, the
// others are refused naming it; the lock's file and the state directory
// it made go when it lets go.
func TestOneAgentAtOnce(t *testing.T) {
	stateDir := t.TempDir()
	const n = 8
	locks := make([]*AgentLock, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { locks[i], errs[i] = LockAgent(stateDir, "lanes-once") })
	}
	wg.Wait()
	var held *AgentLock
	for i := range n {
		switch {
		case errs[i] == nil && held != nil:
			t.Errorf("two agents hold the lock")
		case errs[i] == nil:
			held = locks[i]
		case !strings.Contains(errs[i].Error(), "already runs") || !strings.Contains(errs[i].Error(), "pid "+strconv.Itoa(os.Getpid())):
			t.Errorf("agent %d refused with %v, want the running agent's pid %d", i, errs[i], os.Getpid())
		}
	}
	if held == nil {
		t.Fatal("no agent took the lock")
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(stateDir); len(ents) != 0 {
		t.Errorf("left after the agent let go: %v", ents)
	}
}

// A reset that removes the agent lock between an apply's open of it and
// its flock would leave the apply holding a file no agent opens again:
// the apply holds the one at the path instead, so an agent that comes
// next (LockAgent's exclusive try) is still held off.
func TestHoldAgentOffLockRemoved(t *testing.T) {
	dir := Dir(t.TempDir(), "lanes-removed")
	path := filepath.Join(dir, AgentLockFile)
	removed := false
	testAgentLockOpened = func() {
		if !removed {
			removed = true
			if err := os.Remove(path); err != nil {
				t.Errorf("removing the agent lock as a reset does: %v", err)
			}
		}
	}
	defer func() { testAgentLockOpened = nil }()
	release, err := holdAgentOff(dir, "apply", true)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if !removed {
		t.Fatal("premise: the agent lock was removed under the apply")
	}
	f, err := openAgentLock(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("an agent takes the lock beside the apply (flock: %v), want EWOULDBLOCK", err)
	}
}

// A target's state directory and agent lock are their owner's alone: a
// flock needs only a read-only open, so another user who could open the
// lock (or the directory, whose flock is the journal's lock) could hold
// it and make apply, reset and the agent refuse the target.
func TestStateDirPrivate(t *testing.T) {
	stateDir := t.TempDir()
	// Made as an apply makes them, and left unlocked: what another user
	// could take is what is there between lanes' commands.
	dir := Dir(stateDir, "lanes-private")
	release, err := holdAgentOff(dir, "apply", true)
	if err != nil {
		t.Fatal(err)
	}
	release()
	other := Dir(stateDir, "lanes-journal")
	j, err := knobs.Open(other, "lanes-journal")
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	lock := filepath.Join(dir, AgentLockFile)
	for path, want := range map[string]os.FileMode{dir: 0o700, lock: 0o600, other: 0o700} {
		if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, fi.Mode().Perm(), err, want)
		}
	}
	if os.Geteuid() != 0 {
		return // the check as another user needs root to be one
	}
	// t.TempDir's own directories are 0700: open them to all, so that
	// only lanes' modes stand in the way.
	for _, d := range []string{filepath.Dir(stateDir), stateDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	asNobody := func(path string) error {
		cmd := exec.Command("flock", "--nonblock", "--shared", path, "true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := asNobody(stateDir); err != nil {
		t.Fatalf("premise: nobody can flock the state dir itself: %v", err)
	}
	for _, path := range []string{dir, lock, other} {
		if err := asNobody(path); err == nil || !strings.Contains(err.Error(), "ermission denied") {
			t.Errorf("nobody flocked %s: %v, want permission denied", path, err)
		}
	}
}

// --netns values that would reach outside the state directory are refused
// before anything is read or removed.
func TestResetRefusesBadNetNS(t *testing.T) {
	for _, ns := range []string{"..", "../x", "/etc"} {
		if _, err := Reset(ns, t.TempDir()); err == nil || !strings.Contains(err.Error(), "netns") {
			t.Errorf("reset --netns %q: %v", ns, err)
		}
	}
}
