package plan

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// ModeStatus is what a mode's own datapath parts report for `lanes
// status`: lines for people, and a value for --json.
type ModeStatus struct {
	Lines []string `json:"-"`
	Data  any      `json:"data,omitempty"`
}

// StatusSource is how a policy reports on a target its mode is applied
// to: Read for `lanes status`, Collector (nil: none) for the agent's
// metrics. Each policy registers its own, so control knows none of their
// fields.
type StatusSource struct {
	Read      func(netns string) (ModeStatus, error)
	Collector func(netns string) prometheus.Collector
}

var statusSources = map[string]StatusSource{}

// RegisterStatus makes src the status of modes; call it from the policy
// package's init.
func RegisterStatus(src StatusSource, modes ...string) {
	mu.Lock()
	defer mu.Unlock()
	for _, m := range modes {
		statusSources[m] = src
	}
}

// StatusOf is the status source of mode, if its policy registered one.
func StatusOf(mode string) (StatusSource, bool) {
	mu.Lock()
	defer mu.Unlock()
	src, ok := statusSources[mode]
	return src, ok
}

// StatusModes lists the modes with a status source.
func StatusModes() []string {
	mu.Lock()
	defer mu.Unlock()
	out := make([]string, 0, len(statusSources))
	for m := range statusSources {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}
