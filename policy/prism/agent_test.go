package prism

import (
	"strings"
	"testing"
	"time"

	"github.com/lanesnet/lanes/control/plan"
)

// The agent of an applied prism-sync starts whatever sync settings the
// apply took: a journal with sync settings and no prio-mode (which the
// mode's name gives) is read as prio-mode=sync, never refused as batch,
// which would leave the destinations with no agent renewing them. A
// journal that still names the retired sync-netfilter is refused with the
// line saying what replaced it, as a configuration error.
func TestSyncAgentStartsForAppliedSettings(t *testing.T) {
	for _, params := range []map[string]string{
		{"sync-interval": "200ms"},
		{"prio-mode": "sync", "sync-interval": "200ms"},
	} {
		_, err := plan.NewAgent(SyncAgentName, plan.AgentEnv{NetNS: "lanes-no-such-netns", Mode: "prism-sync", Params: params})
		if err != nil && strings.Contains(err.Error(), "prio-mode") {
			t.Errorf("params %v: %v", params, err)
		}
		o, err := syncAgentOptions(plan.AgentEnv{Mode: "prism-sync", Params: params})
		if err != nil || o.PrioMode != "sync" || o.SyncInterval != 200*time.Millisecond {
			t.Errorf("params %v: options %+v (%v)", params, o, err)
		}
	}
	for _, v := range []string{"trust", "check"} {
		_, err := syncAgentOptions(plan.AgentEnv{Mode: "prism-sync", Params: map[string]string{"sync-netfilter": v}})
		if err == nil || err.Error() != retiredParams["sync-netfilter"] {
			t.Errorf("journal with sync-netfilter=%s: %v, want %q", v, err, retiredParams["sync-netfilter"])
		}
		// Its settings are the cause: no restart mends it.
		env := plan.AgentEnv{NetNS: "lanes-no-such-netns", Mode: "prism-sync", Params: map[string]string{"sync-netfilter": v}}
		if _, err := plan.NewAgent(SyncAgentName, env); !plan.IsConfigError(err) {
			t.Errorf("agent for a journal with sync-netfilter=%s: %v, want a plan.ConfigError", v, err)
		}
	}
}
