package control

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type fakeStatus struct {
	Moves int `json:"moves"`
}

func (s fakeStatus) Summary() []string { return []string{"moved", "twice"} }

type fakeAgent struct{ st any }

func (a fakeAgent) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (a fakeAgent) Status() any                   { return a.st }

// A running agent's report reaches ReadAgentReport with its summary and
// raw status, marked running; it is gone once the agent stops; a report a
// killed agent left says what it last did, not running, and reset's
// removeState takes it away.
func TestAgentReport(t *testing.T) {
	dir := t.TempDir()
	if r, err := ReadAgentReport(dir); r != nil || err != nil {
		t.Fatalf("no report yet: got %+v, %v", r, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		PublishAgentStatus(ctx, dir, "falcon", fakeAgent{fakeStatus{Moves: 2}})
	}()
	var r *AgentReport
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r, _ = ReadAgentReport(dir); r != nil {
			break
		}
	}
	if r == nil || !r.Running || r.PID != os.Getpid() || r.Mode != "falcon" || len(r.Summary) != 2 || r.Summary[1] != "twice" {
		t.Fatalf("report %+v: want running, this pid, mode falcon, the status's summary", r)
	}
	var st fakeStatus
	if err := json.Unmarshal(r.Status, &st); err != nil || st.Moves != 2 {
		t.Errorf("raw status %s (%v): want moves 2", r.Status, err)
	}
	cancel()
	<-done
	if r, err := ReadAgentReport(dir); r != nil || err != nil {
		t.Fatalf("after the agent stopped: %+v, %v; want no report", r, err)
	}

	// A killed agent: a dead pid's report is shown as not running.
	dead := AgentReport{PID: 1 << 30, Mode: "falcon", At: time.Now(), Summary: []string{"x"}}
	b, _ := json.Marshal(dead)
	if err := os.WriteFile(filepath.Join(dir, AgentFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := ReadAgentReport(dir); err != nil || r == nil || r.Running {
		t.Fatalf("dead agent's report %+v, %v: want it, not running", r, err)
	}
	// A stale report of a live pid (this one) is not running either.
	dead.PID, dead.At = os.Getpid(), time.Now().Add(-time.Minute)
	b, _ = json.Marshal(dead)
	os.WriteFile(filepath.Join(dir, AgentFile), b, 0o644)
	if r, _ := ReadAgentReport(dir); r == nil || r.Running {
		t.Fatalf("stale report %+v: want not running", r)
	}
	removeState(dir)
	if _, err := os.Stat(filepath.Join(dir, AgentFile)); !os.IsNotExist(err) {
		t.Errorf("removeState left %s (%v)", AgentFile, err)
	}
}
