package plan

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

type fakeStatus struct {
	At   string `json:"at"`
	Line string `json:"line"`
}

func (s fakeStatus) Summary() []string { return []string{s.Line} }

// fakeAgent runs until ctx ends, or fails at once with err.
type fakeAgent struct {
	name string
	err  error
	ran  chan string
}

func (a fakeAgent) Run(ctx context.Context) error {
	a.ran <- a.name
	if a.err != nil {
		return a.err
	}
	<-ctx.Done()
	return nil
}

func (a fakeAgent) Status() any { return fakeStatus{At: a.name + "-at", Line: a.name + " line"} }

// TestAgentsComposed: a plan composed from two policies names both
// agents in Plan.Agent; lanes agent runs them side by side, the first
// failure stops the other, and the status is the first agent's with the
// second's under its name.
func TestAgentsComposed(t *testing.T) {
	if got := Agents("t-one", "", "t-one", "t-two"); got != "t-one+t-two" {
		t.Fatalf("Agents = %q", got)
	}
	if got := Agents("t-one", ""); got != "t-one" {
		t.Fatalf("Agents of one = %q", got)
	}
	ran := make(chan string, 4)
	fail := errors.New("broken")
	RegisterAgent("t-one", func(AgentEnv) (Agent, error) { return fakeAgent{name: "t-one", ran: ran}, nil })
	RegisterAgent("t-two", func(AgentEnv) (Agent, error) { return fakeAgent{name: "t-two", ran: ran}, nil })
	RegisterAgent("t-bad", func(AgentEnv) (Agent, error) { return fakeAgent{name: "t-bad", err: fail, ran: ran}, nil })

	a, err := NewAgent(Agents("t-one", "t-two"), AgentEnv{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(a.Status())
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		At   string     `json:"at"`
		Line string     `json:"line"`
		Two  fakeStatus `json:"t-two"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.At != "t-one-at" || st.Two.Line != "t-two line" {
		t.Errorf("status %s (%v): want t-one's at the top, t-two's under its name", b, err)
	}
	if own, ok := OwnStatus(a.Status()).(fakeStatus); !ok || own.At != "t-one-at" {
		t.Errorf("OwnStatus = %+v, want t-one's", OwnStatus(a.Status()))
	}
	sum, ok := a.Status().(interface{ Summary() []string })
	if !ok || !slices.Equal(sum.Summary(), []string{"t-one line", "t-two line"}) {
		t.Errorf("summary of the composed status: %v", sum)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	got := []string{<-ran, <-ran}
	slices.Sort(got)
	if !slices.Equal(got, []string{"t-one", "t-two"}) {
		t.Errorf("ran %v", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}

	// One fails: the other stops, and the error names who failed.
	a, err = NewAgent(Agents("t-one", "t-bad"), AgentEnv{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, fail) || !strings.HasPrefix(err.Error(), "t-bad: ") {
			t.Errorf("Run = %v, want t-bad's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a failed agent did not stop the other")
	}
	if _, err := NewAgent("t-one+t-none", AgentEnv{}); err == nil || !strings.Contains(err.Error(), `"t-none"`) {
		t.Errorf("unknown agent in a composition: %v", err)
	}
}

// closingAgent counts the times it was let go of without running.
type closingAgent struct {
	fakeAgent
	closed *int
}

func (a closingAgent) Close() error { *a.closed++; return nil }

// A composed agent whose later agent cannot be built lets go of those
// built before it: they will never run, and would hold what they opened.
func TestAgentsComposedFailedBuildDiscards(t *testing.T) {
	closed := 0
	RegisterAgent("t-holds", func(AgentEnv) (Agent, error) { return closingAgent{closed: &closed}, nil })
	RegisterAgent("t-unbuilt", func(AgentEnv) (Agent, error) { return nil, errors.New("cannot build") })
	RegisterAgent("t-holds2", func(AgentEnv) (Agent, error) { return closingAgent{closed: &closed}, nil })
	if _, err := NewAgent(Agents("t-holds", "t-holds2", "t-unbuilt"), AgentEnv{}); err == nil || !strings.Contains(err.Error(), "cannot build") {
		t.Fatalf("premise: the composed agent fails at its last: %v", err)
	}
	if closed != 2 {
		t.Errorf("%d of the 2 agents built before the failure were let go of", closed)
	}
}
