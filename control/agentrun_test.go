package control

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Apply and reset refuse a target whose agent runs, in one line naming
// its PID: the agent would go on working for a plan that is gone.
func TestApplyResetRefuseRunningAgent(t *testing.T) {
	stateDir := t.TempDir()
	dir := Dir(stateDir, "lanes-agentrun")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pid := os.Getppid() // a live process that is not this one
	b, _ := json.Marshal(AgentReport{PID: pid, Mode: "falcon", At: time.Now()})
	if err := os.WriteFile(filepath.Join(dir, AgentFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Reset("lanes-agentrun", stateDir)
	if err == nil || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) || strings.Contains(err.Error(), "\n") {
		t.Errorf("reset with an agent running: %v, want one line naming pid %d", err, pid)
	}
	if _, err := os.Stat(filepath.Join(dir, AgentFile)); err != nil {
		t.Errorf("the refused reset touched the target: %v", err)
	}
	if err := agentRunning(dir, "apply"); err == nil {
		t.Error("apply's check passes with an agent running")
	}
	// A report the agent's own process reads, or a stale one, does not refuse.
	b, _ = json.Marshal(AgentReport{PID: pid, Mode: "falcon", At: time.Now().Add(-time.Minute)})
	os.WriteFile(filepath.Join(dir, AgentFile), b, 0o644)
	if err := agentRunning(dir, "reset"); err != nil {
		t.Errorf("a stale report refused: %v", err)
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
