package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/datapath/steer"
)

// A full file comes through as written, in the forms the rest of lanes
// takes.
func TestParseFull(t *testing.T) {
	src := `# lanes on a testbed host
netns: lanes-h2
mode: falcon-prism
settings:
  threshold: 70
  interval: 40ms
  pipeline: true
cpus: 0-1
prio:
  - dst 198.18.2.21 port 11111 udp
  - src 198.18.1.21
agent:
  metrics-addr: 127.0.0.1:19477
  on-exit: keep
state-dir: /run/lanes-test
`
	c, err := Parse("lanes.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := steer.ParseRule("dst 198.18.2.21 port 11111 udp")
	r2, _ := steer.ParseRule("src 198.18.1.21")
	want := Config{
		Path: "lanes.yaml", NetNS: "lanes-h2", Mode: "falcon-prism",
		Settings: map[string]string{"threshold": "70", "interval": "40ms", "pipeline": "true"},
		CPUs:     "0-1", Prio: []steer.Rule{r1, r2}, StateDir: "/run/lanes-test",
		Agent: Agent{MetricsAddr: "127.0.0.1:19477", OnExit: OnExitKeep},
	}
	if c.Path != want.Path || c.NetNS != want.NetNS || c.Mode != want.Mode || c.CPUs != want.CPUs ||
		c.StateDir != want.StateDir || c.Agent != want.Agent || !slices.Equal(c.Prio, want.Prio) ||
		len(c.Settings) != len(want.Settings) {
		t.Fatalf("got %+v\nwant %+v", *c, want)
	}
	for k, v := range want.Settings {
		if c.Settings[k] != v {
			t.Errorf("setting %s = %q, want %q", k, c.Settings[k], v)
		}
	}
}

// Everything left out takes its default: netns auto, the agent's loopback
// address, reset on exit, /run/lanes.
func TestParseDefaults(t *testing.T) {
	c, err := Parse("lanes.yaml", []byte("mode: rps\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NetNS != NetNSAuto || c.Agent.MetricsAddr != DefaultMetricsAddr || c.Agent.OnExit != OnExitReset ||
		c.StateDir != control.DefaultStateDir || c.Settings != nil || c.Prio != nil || c.CPUs != "" {
		t.Fatalf("defaults: %+v", *c)
	}
	c, err = Parse("lanes.yaml", []byte("mode: rps\nnetns: host\nagent:\n  metrics-addr: \"\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.MetricsAddr != "" {
		t.Errorf("metrics-addr \"\" must turn the server off, got %q", c.Agent.MetricsAddr)
	}
	o, err := c.Options()
	if err != nil || o.NetNS != "" || o.Mode != "rps" || o.StateDir != control.DefaultStateDir {
		t.Errorf("netns host: options %+v, %v", o, err)
	}
}

// Every bad file is refused with one line per problem: FILE:LINE, what,
// and how to fix it; all problems at once, in line order.
func TestParseBad(t *testing.T) {
	const f = "lanes.yaml"
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"empty", "", []string{
			`lanes.yaml:1: the file is empty: it needs at least a mode, e.g. "mode: rps" (example: deploy/lanes.yaml)`}},
		{"no mode", "netns: auto\n", []string{
			`lanes.yaml:1: no mode: add a line like "mode: rps" (modes: falcon, falcon-balance, falcon-pipeline, falcon-prism, falcon-split, fast, mflow, prism, prism-batch, prism-sync, rps, vanilla)`}},
		{"unknown key", "mode: rps\nmod: x\n", []string{
			`lanes.yaml:2: unknown key "mod": did you mean "mode"? the file takes netns, mode, settings, cpus, prio, agent, state-dir`}},
		{"unknown key far from any", "mode: rps\nbananas: 3\n", []string{
			`lanes.yaml:2: unknown key "bananas": the file takes netns, mode, settings, cpus, prio, agent, state-dir`}},
		{"unknown mode", "mode: faster\n", []string{
			`lanes.yaml:1: unknown mode "faster": use one of falcon, falcon-balance, falcon-pipeline, falcon-prism, falcon-split, fast, mflow, prism, prism-batch, prism-sync, rps, vanilla`}},
		{"empty mode", "mode:\n", []string{
			`lanes.yaml:1: mode has no value: give one or drop the key`}},
		{"mode a list", "mode: [rps]\n", []string{
			`lanes.yaml:1: mode: want a single value, not a list`}},
		{"key twice", "mode: rps\nmode: vanilla\n", []string{
			`lanes.yaml:2: key "mode" given twice (first on line 1): keep one`}},
		{"setting unknown and value bad", "mode: falcon\nsettings:\n  treshold: 70\n  threshold: x\n", []string{
			`lanes.yaml:3: mode falcon has no setting "treshold": it takes irq-cpus, pipeline, split, balance, split-cpus, threshold, home-room, mice, hysteresis, interval, flowlet, drain, load, queue-size, rt, prio, high-rt, high, high-auto-pps, bulk-quiet, bulk, spread, x-fallback, x-damp, x-sampler, x-agent-sched, x-stay, x-bare, x-park, x-bulk-inline, x-fast`,
			`lanes.yaml:4: bad falcon setting threshold="x": want a percentage 0..100`}},
		{"two bad values", "mode: falcon\nsettings:\n  interval: 1h\n  load: cpu\n", []string{
			`lanes.yaml:3: bad falcon setting interval="1h": want 1ms..10s`,
			`lanes.yaml:4: bad falcon setting load="cpu": want rx or busy`}},
		{"setting bounded by another", "mode: falcon\nsettings:\n  home-room: 90\n  threshold: 50\n", []string{
			`lanes.yaml:3: falcon home-room 90 must be at most the threshold 50: a core over the threshold takes no stages`}},
		{"setting a list", "mode: falcon\nsettings:\n  threshold: [1]\n", []string{
			`lanes.yaml:3: setting threshold: want a single value, not a list`}},
		{"settings for a mode without", "mode: vanilla\nsettings:\n  threshold: 3\n", []string{
			`lanes.yaml:3: mode vanilla takes no settings, but threshold was given: drop it or pick a mode that uses it`}},
		{"settings a list", "mode: rps\nsettings:\n  - a\n", []string{
			"lanes.yaml:2: settings: want a mapping of the mode's settings (KEY: VALUE lines, `lanes modes` lists them), not a list"}},
		{"prism setting", "mode: prism\nsettings:\n  prio-mode: fast\n", []string{
			`lanes.yaml:3: bad prism setting prio-mode="fast": want batch or sync`}},
		{"retired setting", "mode: prism-sync\nsettings:\n  sync-interval: 1s\n  sync-netfilter: trust\n", []string{
			`lanes.yaml:4: ` + retiredSyncNetfilter}},
		{"retired setting, its old default", "mode: prism\nsettings:\n  prio-mode: sync\n  sync-netfilter: check\n", []string{
			`lanes.yaml:4: ` + retiredSyncNetfilter}},
		{"prio without classes", "mode: rps\nprio:\n  - dst 198.18.2.21 port 11111 udp\n", []string{
			`lanes.yaml:2: mode rps has no priority classes, so prio rules would do nothing: drop prio, or use a mode that has them (falcon-prism, prism, prism-batch, prism-sync)`}},
		{"prio needs the falcon setting", "mode: falcon\nprio:\n  - dst 198.18.2.21\n", []string{
			`lanes.yaml:2: mode falcon has priority classes only with the setting prio: true, so these rules would do nothing: add it under settings, or drop prio`}},
		{"bad rules", "mode: prism\nprio:\n  - dst 198.18.2.300\n  - dst 198.18.2.2 port 80\n  - dst 198.18.2.2 port 80\n  - {dst: x}\n", []string{
			`lanes.yaml:3: priority rule "dst 198.18.2.300": "198.18.2.300" is not an IPv4 address (want [dst|src] ADDR [port N] [tcp|udp])`,
			`lanes.yaml:5: priority rule dst 198.18.2.2 port 80 given twice (first on line 4): keep one`,
			`lanes.yaml:6: prio: a rule is one line of text like "dst 198.18.2.21 port 11111 udp", not a mapping`}},
		{"prio not a list", "mode: prism\nprio: dst 198.18.2.2\n", []string{
			`lanes.yaml:2: prio: want a list of rules, one "- [dst|src] ADDR [port N] [tcp|udp]" a line, not the value "dst 198.18.2.2"`}},
		{"agent", "mode: rps\nagent:\n  metrics-addr: localhost\n  on-exit: stop\n  metric-addr: x\n", []string{
			`lanes.yaml:3: agent.metrics-addr "localhost": want HOST:PORT like 127.0.0.1:9477, or "" for no server`,
			`lanes.yaml:4: agent.on-exit "stop": want reset (put every knob back when the agent stops) or keep (leave the mode applied)`,
			`lanes.yaml:5: unknown key "agent.metric-addr": did you mean "agent.metrics-addr"? agent takes metrics-addr, on-exit`}},
		{"agent port", "mode: rps\nagent:\n  metrics-addr: :http\n", []string{
			`lanes.yaml:3: agent.metrics-addr ":http": port "http" is not a number 0..65535`}},
		{"agent a value", "mode: rps\nagent: yes\n", []string{
			`lanes.yaml:2: agent: want a mapping (metrics-addr, on-exit), not the value "yes"`}},
		{"cpus syntax", "mode: rps\ncpus: 0-x\n", []string{
			`lanes.yaml:2: cpus: bad CPU list "0-x": "0-x" is not a core number or range (like 2 or 0-3)`}},
		{"cpus offline", "mode: rps\ncpus: 4095\n", []string{
			`lanes.yaml:2: cpus: core 4095 is not online: this machine has cores ` + onlineList(t)}},
		{"netns", "mode: rps\nnetns: a/b\n", []string{
			`lanes.yaml:2: netns "a/b": want auto, host, a name under /run/netns, an absolute path to a namespace file, or pid:N`}},
		{"netns pid", "mode: rps\nnetns: pid:x\n", []string{
			`lanes.yaml:2: netns "pid:x": want pid:N with N a process id`}},
		{"state dir", "mode: rps\nstate-dir: run/lanes\n", []string{
			`lanes.yaml:2: state-dir "run/lanes": want a clean absolute path, e.g. /run/lanes`}},
		{"syntax", "mode: rps\n  x: y\n", []string{
			`lanes.yaml:2: YAML syntax: mapping values are not allowed in this context: fix the line (keys are "key: value", list items "- value", indented with spaces)`}},
		{"tab", "mode: rps\nagent:\n\ton-exit: keep\n", []string{
			`lanes.yaml:3: YAML syntax: found character that cannot start any token: fix the line (keys are "key: value", list items "- value", indented with spaces)`}},
		{"not a mapping", "- mode\n", []string{
			`lanes.yaml:1: the file must be a mapping of keys (netns, mode, settings, cpus, prio, agent, state-dir), not a list`}},
		{"two documents", "mode: rps\n---\nmode: x\n", []string{
			`lanes.yaml:2: a second YAML document: one file holds one configuration, drop the "---" and what follows`}},
	} {
		c, err := Parse(f, []byte(tc.src))
		if err == nil {
			t.Errorf("%s: accepted: %+v", tc.name, *c)
			continue
		}
		if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, tc.want) {
			t.Errorf("%s: error lines\n  %s\nwant\n  %s", tc.name, strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
		}
		var ce *Error
		if !errors.As(err, &ce) || ce.Path != f || ce.Line < 1 {
			t.Errorf("%s: not a *config.Error with a line: %#v", tc.name, err)
		}
	}
}

// retiredSyncNetfilter is the line that refuses prism's retired
// sync-netfilter, whatever its value.
const retiredSyncNetfilter = "sync-netfilter is gone: PRISM-sync takes its shortcut only where no netfilter table (iptables, nftables, legacy ebtables) can see the overlay's frames, and never past one; remove the setting"

func onlineList(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Skip(err)
	}
	return strings.TrimSpace(string(b))
}

// Load names the file in its errors; a file that is not there says where
// the example is.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "lanes.yaml")
	if err := os.WriteFile(p, []byte("mode: rps\ncpus: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.HasPrefix(err.Error(), p+":2: cpus:") {
		t.Errorf("Load: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "none.yaml")); err == nil || !strings.Contains(err.Error(), "deploy/lanes.yaml") {
		t.Errorf("Load of a missing file: %v", err)
	}
}

// netns: auto takes the one namespace with a VXLAN device, and refuses
// none or several with what to write instead.
func TestPickOverlay(t *testing.T) {
	has := func(with ...string) func(string) (bool, error) {
		return func(ns string) (bool, error) {
			if ns == "gone" {
				return false, errors.New("no such namespace")
			}
			return slices.Contains(with, ns), nil
		}
	}
	cands := []string{"", "/var/run/docker/netns/1-abc", "/var/run/docker/netns/0f3e", "gone", "lanes-h2"}
	if ns, err := pickOverlay(cands, has("/var/run/docker/netns/1-abc")); err != nil || ns != "/var/run/docker/netns/1-abc" {
		t.Errorf("one overlay: %q, %v", ns, err)
	}
	if ns, err := pickOverlay(cands, has("")); err != nil || ns != "" {
		t.Errorf("overlay in lanes' own namespace: %q, %v", ns, err)
	}
	if _, err := pickOverlay(cands, has()); err == nil || !strings.Contains(err.Error(), "no namespace holds a VXLAN device") {
		t.Errorf("no overlay: %v", err)
	}
	_, err := pickOverlay(cands, has("", "lanes-h2"))
	if err == nil || err.Error() != "2 namespaces hold a VXLAN device (host, lanes-h2): set netns to the one lanes should steer" {
		t.Errorf("two overlays: %v", err)
	}
}

// A refused file makes the command exit with ExitConfig, which the
// systemd unit does not restart for.
func TestExitCode(t *testing.T) {
	_, err := Parse("lanes.yaml", []byte("mode: x\nmod: y\n"))
	var c interface{ ExitCode() int }
	if !errors.As(err, &c) || c.ExitCode() != ExitConfig {
		t.Errorf("bad file: %v has no exit code %d", err, ExitConfig)
	}
	_, err = Load(filepath.Join(t.TempDir(), "none.yaml"))
	if !errors.As(err, &c) || c.ExitCode() != ExitConfig || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// The systemd unit restarts a failed agent, but not one that exits with
// ExitConfig: a refused file, or a mode its own start applied and could
// not run (reset before it exits).
func TestUnitDoesNotRestartOnConfigError(t *testing.T) {
	b, err := os.ReadFile("../../../deploy/systemd/lanes.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]string{}
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok && !strings.HasPrefix(k, "#") {
			unit[k] = v
		}
	}
	if unit["Restart"] != "on-failure" {
		t.Errorf("Restart=%s, want on-failure", unit["Restart"])
	}
	if want := strconv.Itoa(ExitConfig); !slices.Contains(strings.Fields(unit["RestartPreventExitStatus"]), want) {
		t.Errorf("RestartPreventExitStatus=%s, want %s among them", unit["RestartPreventExitStatus"], want)
	}
}
