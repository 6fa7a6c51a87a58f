package control

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/attach"
	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/heartbeat"
	"github.com/lanesnet/lanes/internal/testenv"
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

// writeTestTarget writes a target directory as an apply leaves it: a state
// file and a journal with the given tcx attachments.
func writeTestTarget(t *testing.T, dir, mode, phase string, tcx ...attach.TCX) {
	t.Helper()
	if err := writeState(dir, &State{Mode: mode, Target: "host", Phase: phase, CPUs: "0"}); err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Kind     string          `json:"kind"`
		Key      string          `json:"key"`
		Knob     json.RawMessage `json:"knob"`
		Original []byte          `json:"original"`
		At       time.Time       `json:"at"`
	}
	doc := struct {
		Version int     `json:"version"`
		Target  string  `json:"target"`
		Entries []entry `json:"entries"`
	}{Version: 1, Target: "host", Entries: []entry{}}
	for _, k := range tcx {
		b, _ := json.Marshal(k)
		doc.Entries = append(doc.Entries, entry{Kind: k.Kind(), Key: k.Key(), Knob: b, Original: []byte{}, At: time.Now()})
	}
	b, _ := json.Marshal(doc)
	if err := os.WriteFile(filepath.Join(dir, knobs.JournalFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// /readyz: not ready without a mode or with an apply that did not finish;
// ready when every journaled program is attached or its device is gone;
// not ready when one is detached, unless an agent parked it.
func TestCheckReady(t *testing.T) {
	dir := t.TempDir()
	if r := CheckReady(dir); r.Ready || r.Reason != "no mode applied" {
		t.Errorf("empty target: %+v", r)
	}
	gone := attach.TCX{Device: "lanesnodev0", Direction: "ingress", Prog: "/sys/fs/bpf/lanes/x/p", Link: "/sys/fs/bpf/lanes/x/l"}
	writeTestTarget(t, dir, "falcon", Applying, gone)
	if r := CheckReady(dir); r.Ready || r.Mode != "falcon" || !strings.Contains(r.Reason, "has not finished") {
		t.Errorf("apply under way: %+v", r)
	}
	writeTestTarget(t, dir, "falcon", Applied, gone)
	if r := CheckReady(dir); !r.Ready || r.Programs != 1 || r.Gone != 1 || r.Attached != 0 {
		t.Errorf("a program whose device went: %+v; want ready, 1 program, gone", r)
	}
	testenv.Root(t) // reading a device's tcx programs
	detached := attach.TCX{Device: "lo", Direction: "ingress", Prog: "/sys/fs/bpf/lanes/x/p", Link: "/sys/fs/bpf/lanes/x/l"}
	writeTestTarget(t, dir, "falcon", Applied, gone, detached)
	r := CheckReady(dir)
	if r.Ready || r.Programs != 2 || !strings.Contains(r.Reason, "1 of 2 programs not attached (tcx-link:host:lo:ingress#l)") {
		t.Errorf("a detached program: %+v", r)
	}
	if err := os.WriteFile(filepath.Join(dir, plan.AgentStateFile), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := CheckReady(dir); !r.Ready || r.Parked != 1 {
		t.Errorf("a program the agent parked: %+v; want ready, 1 parked", r)
	}
}

// /healthz answers 200 while status rounds come, 503 with the reason once
// they stop; /readyz 503 until the target is ready, and once it was
// applied again after the agent started.
func TestHealthEndpoints(t *testing.T) {
	dir := t.TempDir()
	writeTestTarget(t, dir, "falcon", Applied, attach.TCX{Device: "lanesnodev0", Direction: "ingress", Prog: "/p", Link: "/l"})
	h := NewHealth(dir, "falcon", nil)
	now := time.Now()
	h.now = func() time.Time { return now }
	get := func(handler http.HandlerFunc) (int, map[string]any) {
		rec := httptest.NewRecorder()
		handler(rec, httptest.NewRequest("GET", "/", nil))
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("body %q: %v", rec.Body.String(), err)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
		return rec.Code, body
	}

	// Before the first round: healthy while the start is recent.
	if code, _ := get(h.ServeHealthz); code != 200 {
		t.Errorf("at the start: %d", code)
	}
	b, _ := json.Marshal(struct {
		At time.Time `json:"at"`
	}{now.Add(-40 * time.Millisecond)})
	h.round(AgentReport{At: now, Status: b})
	now = now.Add(2 * time.Second)
	code, body := get(h.ServeHealthz)
	if code != 200 || body["ok"] != true || body["last_round_age_seconds"].(float64) != 2 {
		t.Errorf("2 s after a round: %d %v", code, body)
	}
	if a, ok := body["agent_round_age_seconds"].(float64); !ok || a < 2.03 || a > 2.05 {
		t.Errorf("agent's own round age %v, want 2.04", body["agent_round_age_seconds"])
	}
	now = now.Add(AgentStaleAfter)
	code, body = get(h.ServeHealthz)
	if code != 503 || body["ok"] != false || !strings.Contains(body["reason"].(string), "stuck") {
		t.Errorf("stale: %d %v", code, body)
	}

	code, body = get(h.ServeReadyz)
	if code != 200 || body["ready"] != true || body["mode"] != "falcon" {
		t.Errorf("applied: %d %v", code, body)
	}
	// Applied again (a new journal generation): cached for readyCache,
	// then not ready.
	time.Sleep(5 * time.Millisecond)
	writeTestTarget(t, dir, "falcon", Applied, attach.TCX{Device: "lanesnodev1", Direction: "ingress", Prog: "/p", Link: "/l"})
	if code, _ := get(h.ServeReadyz); code != 200 {
		t.Errorf("within the cache time: %d", code)
	}
	now = now.Add(readyCache)
	code, body = get(h.ServeReadyz)
	if code != 503 || !strings.Contains(body["reason"].(string), "applied again") {
		t.Errorf("applied again: %d %v", code, body)
	}
	removeState(dir)
	now = now.Add(readyCache)
	if code, body = get(h.ServeReadyz); code != 503 || body["reason"] != "no mode applied" {
		t.Errorf("after a reset: %d %v", code, body)
	}
}

// /healthz is 503 once one of the agent's loops stops beating, naming it,
// while the status rounds still come (a loop that holds no lock across
// its round hangs without stopping them); a loop that dozes longer than
// that, having said so, keeps it 200.
func TestHealthzNamesStuckLoop(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	beats := heartbeat.NewBoard(clock)
	h := NewHealth(t.TempDir(), "prism", beats)
	h.now = clock
	guard := beats.Loop("prism guard", 100*time.Millisecond)
	follower := beats.Loop("container follower", time.Second)
	dozer := beats.Loop("dozer", 100*time.Millisecond)
	live := func() (int, Liveness) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHealthz(rec, httptest.NewRequest("GET", "/healthz", nil))
		var l Liveness
		if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		return rec.Code, l
	}
	step := func(d time.Duration) {
		now = now.Add(d)
		h.round(AgentReport{At: now}) // the status rounds go on
		guard.Beat()
	}
	dozer.Doze(time.Hour)
	for range 10 {
		step(time.Second)
		follower.Beat()
	}
	if code, l := live(); code != 200 || len(l.Loops) != 3 {
		t.Fatalf("premise: every loop beats (the dozer dozes): %d %+v", code, l)
	}
	for range 10 {
		step(time.Second) // the follower hangs
	}
	code, l := live()
	if code != 503 || l.OK || !strings.Contains(l.Reason, "container follower: no beat for 10.0s") || strings.Contains(l.Reason, "dozer") || strings.Contains(l.Reason, "guard") {
		t.Errorf("the follower stuck: %d %+v, want 503 naming it alone", code, l)
	}
}
