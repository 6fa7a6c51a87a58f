package control

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"time"

	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/knobs"
	"golang.org/x/sys/unix"
)

// AgentFile is where a running agent publishes what it does, next to the
// target's state file, for `lanes status` (which runs in another process
// and cannot ask the agent). The agent removes it when it stops; `lanes
// reset` removes one a killed agent left.
const AgentFile = "agent.json"

// AgentPublishEvery is how often a running agent rewrites AgentFile.
const AgentPublishEvery = time.Second

// AgentReport is an agent's last word about itself.
type AgentReport struct {
	PID  int       `json:"pid"`
	Mode string    `json:"mode"`
	At   time.Time `json:"at"`
	// Summary says in a few lines what the agent is doing (from the
	// status's Summary method, when it has one).
	Summary []string `json:"summary,omitempty"`
	// Status is the agent's own status, as its Status method returns it.
	Status json.RawMessage `json:"status,omitempty"`
	// Containers is what the container follower beside the agent did
	// (follow.go).
	Containers *FollowStatus `json:"containers,omitempty"`
	// Running is set by ReadAgentReport: the writer still lives and the
	// report is fresh. A killed agent's report says what it last did.
	Running bool `json:"running"`
}

// Summarizer is what an agent status implements to be shown by `lanes
// status` as lines of text instead of raw JSON.
type Summarizer interface {
	Summary() []string
}

// PublishAgentStatus writes ag's status into dir's AgentFile every
// AgentPublishEvery until ctx ends, then removes the file.
func PublishAgentStatus(ctx context.Context, dir, mode string, ag plan.Agent) {
	path := filepath.Join(dir, AgentFile)
	defer os.Remove(path)
	defer os.Remove(path + ".tmp")
	tick := time.NewTicker(AgentPublishEvery)
	defer tick.Stop()
	for {
		writeAgentReport(path, mode, ag)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func writeAgentReport(path, mode string, ag plan.Agent) {
	st := ag.Status()
	r := AgentReport{PID: os.Getpid(), Mode: mode, At: time.Now()}
	if s, ok := st.(Summarizer); ok {
		r.Summary = s.Summary()
	}
	if b, err := json.Marshal(st); err == nil {
		r.Status = b
	}
	if f, ok := ag.(interface{ FollowStatus() FollowStatus }); ok {
		fs := f.FollowStatus()
		r.Containers = &fs
		r.Summary = append(r.Summary, fs.Summary()...)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return
	}
	// Best effort: a status file that cannot be written costs `lanes
	// status` a section, not the agent its work.
	_ = knobs.WriteFileAtomic(path, append(b, '\n'))
}

// ReadAgentReport reads dir's AgentFile; nil, nil when there is none.
func ReadAgentReport(dir string) (*AgentReport, error) {
	r, err := readJSONFile[AgentReport](filepath.Join(dir, AgentFile))
	if r == nil || err != nil {
		return r, err
	}
	alive := r.PID > 0 && unix.Kill(r.PID, 0) == nil
	r.Running = alive && time.Since(r.At) < 5*AgentPublishEvery
	return r, nil
}

func removeAgentReport(dir string) {
	os.Remove(filepath.Join(dir, AgentFile))
	os.Remove(filepath.Join(dir, AgentFile+".tmp"))
}
