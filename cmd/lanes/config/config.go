// Package config reads lanes' configuration file (default
// /etc/lanes/lanes.yaml): what `lanes apply --config` applies and `lanes
// agent --config` applies and keeps running. One schema, in YAML:
//
//	netns: auto              # auto | host | NAME | /path/to/netns | pid:N
//	mode: falcon             # a mode of `lanes modes`
//	settings:                # the mode's settings, as `lanes apply --set KEY=VALUE`
//	  threshold: 70
//	cpus: 0-3                # cores the mode may use (default: all online)
//	prio:                    # high-priority flows, as `lanes prio add` takes them
//	  - dst 198.18.2.21 port 11111 udp
//	agent:
//	  metrics-addr: 127.0.0.1:9477   # /metrics, /healthz, /readyz ("" = off)
//	  on-exit: reset                 # reset | keep
//	state-dir: /run/lanes
//
// Load checks the whole file before anything is applied: unknown keys,
// values of the wrong shape and values the mode refuses are each reported
// as FILE:LINE: what, and how to fix it. The checks are lanes' own: mode
// names and setting keys through package plan, setting values through the
// mode's planner, CPU lists through package knobs, rules through package
// steer.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/lanesnet/lanes/control"
	"github.com/lanesnet/lanes/control/plan"
	"github.com/lanesnet/lanes/datapath/steer"
	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/netnsx"
	"github.com/lanesnet/lanes/topology"
)

// DefaultPath is where lanes agent and the systemd unit look for the file.
const DefaultPath = "/etc/lanes/lanes.yaml"

// DefaultMetricsAddr is loopback only: metrics and health describe the
// host's placement and are nobody else's business unless the operator
// says so.
const DefaultMetricsAddr = "127.0.0.1:9477"

// Values of netns and agent.on-exit with a meaning of their own.
const (
	NetNSAuto   = "auto" // the one namespace that holds a VXLAN overlay
	NetNSHost   = "host" // the namespace lanes runs in
	OnExitReset = "reset"
	OnExitKeep  = "keep"
)

// Config is a checked configuration file.
type Config struct {
	// Path is the file it was read from.
	Path string
	// NetNS is the target as written: NetNSAuto, NetNSHost, a name under
	// /run/netns, an absolute path to a namespace file, or pid:N.
	NetNS string
	Mode  string
	// Settings are the mode's settings, as --set KEY=VALUE gives them;
	// nil when there are none.
	Settings map[string]string
	// CPUs is a CPU list ("0-3,6"); "" = all online.
	CPUs     string
	Prio     []steer.Rule
	StateDir string
	Agent    Agent
}

// Agent is the agent's part of the file.
type Agent struct {
	// MetricsAddr serves /metrics, /healthz and /readyz; "" = no server.
	MetricsAddr string
	// OnExit is what the agent does on SIGTERM or SIGINT: OnExitReset
	// puts every knob back (as tuned rolls its profile back), OnExitKeep
	// leaves the mode applied.
	OnExit string
}

// Error is one problem of a file, at a line: FILE:LINE: what and how to
// fix it.
type Error struct {
	Path string
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg) }

// ExitConfig is the exit status of a command refused for its
// configuration file (sysexits' EX_CONFIG): the systemd unit does not
// restart the agent for it, since only an edit mends it.
const ExitConfig = 78

// ExitCode makes a command that fails on the file exit with ExitConfig.
func (e *Error) ExitCode() int { return ExitConfig }

// readError is a file that cannot be read.
type readError struct{ err error }

func (e readError) Error() string {
	return fmt.Sprintf("reading config: %v (the example is deploy/lanes.yaml)", e.err)
}
func (e readError) Unwrap() error { return e.err }
func (e readError) ExitCode() int { return ExitConfig }

// Load reads and checks the file at path. Its error lists every problem
// found, one *Error a line (errors.Join). A file that someone other than
// root or lanes' user could have written is refused unread (readSafe).
func Load(path string) (*Config, error) {
	b, err := readSafe(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Parse checks b as the contents of the file at path.
func Parse(path string, b []byte) (*Config, error) {
	p := &parser{path: path}
	c := p.parse(b)
	if len(p.errs) > 0 {
		sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
		errs := make([]error, len(p.errs))
		for i, e := range p.errs {
			errs[i] = e
		}
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// Options are the file as control.Apply takes it, with netns: auto
// resolved to the namespace it stands for.
func (c *Config) Options() (control.Options, error) {
	ns, err := c.TargetNetNS()
	if err != nil {
		return control.Options{}, err
	}
	return control.Options{Mode: c.Mode, NetNS: ns, CPUs: c.CPUs, StateDir: c.StateDir, Params: maps.Clone(c.Settings)}, nil
}

// TargetNetNS is the namespace the file names, in the form the rest of
// lanes takes ("" for the namespace lanes runs in); auto is resolved now.
func (c *Config) TargetNetNS() (string, error) {
	switch c.NetNS {
	case NetNSHost:
		return "", nil
	case NetNSAuto:
		ns, err := AutoNetNS()
		if err != nil {
			return "", fmt.Errorf("%s: netns auto: %w", c.Path, err)
		}
		return ns, nil
	}
	if !netnsx.Exists(c.NetNS) {
		return "", fmt.Errorf("%s: %w", c.Path, netnsx.NotFoundError(c.NetNS))
	}
	return c.NetNS, nil
}

// keys are the file's keys, in the order the errors list them.
var (
	topKeys   = []string{"netns", "mode", "settings", "cpus", "prio", "agent", "state-dir"}
	agentKeys = []string{"metrics-addr", "on-exit"}
)

type parser struct {
	path string
	errs []*Error
}

func (p *parser) errorf(line int, format string, args ...any) {
	p.errs = append(p.errs, &Error{Path: p.path, Line: max(line, 1), Msg: fmt.Sprintf(format, args...)})
}

// yamlLine finds the line in the YAML library's syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

func (p *parser) parse(b []byte) *Config {
	c := &Config{Path: p.path, NetNS: NetNSAuto, StateDir: control.DefaultStateDir, Agent: Agent{MetricsAddr: DefaultMetricsAddr, OnExit: OnExitReset}}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errorf(1, "the file is empty: it needs at least a mode, e.g. \"mode: rps\" (example: deploy/lanes.yaml)")
			return nil
		}
		p.syntax(err)
		return nil
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		p.errorf(more.Line, "a second YAML document: one file holds one configuration, drop the \"---\" and what follows")
	} else if !errors.Is(err, io.EOF) {
		p.syntax(err)
	}
	root := deref(&doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = deref(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root.Line, "the file must be a mapping of keys (%s), not %s", strings.Join(topKeys, ", "), kindName(root))
		return nil
	}
	top := p.mapping(root, "", topKeys)
	var modeLine int
	if n := top["netns"]; n != nil {
		if v, ok := p.scalar(n, "netns"); ok {
			c.NetNS = v
			p.checkNetNS(n.Line, v)
		}
	}
	if n := top["mode"]; n != nil {
		modeLine = n.Line
		if v, ok := p.scalar(n, "mode"); ok {
			c.Mode = v
		}
	}
	if n := top["cpus"]; n != nil {
		if v, ok := p.scalar(n, "cpus"); ok {
			c.CPUs = v
			p.checkCPUs(n.Line, v)
		}
	}
	if n := top["state-dir"]; n != nil {
		if v, ok := p.scalar(n, "state-dir"); ok {
			if !filepath.IsAbs(v) || filepath.Clean(v) != v {
				p.errorf(n.Line, "state-dir %q: want a clean absolute path, e.g. %s", v, control.DefaultStateDir)
			} else {
				c.StateDir = v
			}
		}
	}
	if n := top["agent"]; n != nil {
		p.agent(n, &c.Agent)
	}
	planner := p.mode(root.Line, modeLine, c.Mode)
	var settingsLine int
	var settingLines map[string]int
	if n := top["settings"]; n != nil {
		settingsLine = n.Line
		c.Settings, settingLines = p.settings(n)
	}
	settingsOK := true
	if planner != nil && len(c.Settings) > 0 {
		settingsOK = p.checkSettings(planner, c.Settings, settingsLine, settingLines)
	}
	if n := top["prio"]; n != nil {
		c.Prio = p.prio(n)
		switch {
		case len(c.Prio) == 0 || planner == nil || !settingsOK || plan.Prioritizes(c.Mode, c.Settings):
		case plan.Takes(c.Mode, "prio"):
			p.errorf(n.Line, "mode %s has priority classes only with the setting prio: true, so these rules would do nothing: add it under settings, or drop prio", c.Mode)
		default:
			p.errorf(n.Line, "mode %s has no priority classes, so prio rules would do nothing: drop prio, or use a mode that has them (%s)", c.Mode, strings.Join(prioModes(), ", "))
		}
	}
	return c
}

func (p *parser) syntax(err error) {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		p.errorf(line, "YAML syntax: %s: fix the line (keys are \"key: value\", list items \"- value\", indented with spaces)", m[2])
		return
	}
	p.errorf(1, "YAML syntax: %s", strings.TrimPrefix(err.Error(), "yaml: "))
}

// mapping returns n's values by key, reporting keys not in known (with the
// nearest known one) and keys given twice. prefix names n's own key.
// A list or mapping value carries its key's line (a block one starts on
// the line after it), where errors about it as a whole are reported.
func (p *parser) mapping(n *yaml.Node, prefix string, known []string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		name := prefix + k.Value
		switch {
		case k.Kind != yaml.ScalarNode:
			p.errorf(k.Line, "a key must be a plain word, not %s", kindName(k))
		case !slices.Contains(known, k.Value):
			hint := ""
			if s := nearest(k.Value, known); s != "" {
				hint = fmt.Sprintf("did you mean %q? ", prefix+s)
			}
			where := "the file"
			if prefix != "" {
				where = strings.TrimSuffix(prefix, ".")
			}
			p.errorf(k.Line, "unknown key %q: %s%s takes %s", name, hint, where, strings.Join(known, ", "))
		case out[k.Value] != nil:
			p.errorf(k.Line, "key %q given twice (first on line %d): keep one", name, out[k.Value].Line)
		default:
			if v.Kind != yaml.ScalarNode {
				// A copy: an alias's target is shared.
				c := *v
				c.Line = k.Line
				v = &c
			}
			out[k.Value] = v
		}
	}
	return out
}

// scalar is n's value, which must be a single value.
func (p *parser) scalar(n *yaml.Node, key string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		p.errorf(n.Line, "%s: want a single value, not %s", key, kindName(n))
		return "", false
	}
	if n.Tag == "!!null" {
		p.errorf(n.Line, "%s has no value: give one or drop the key", key)
		return "", false
	}
	return n.Value, true
}

func (p *parser) checkNetNS(line int, v string) {
	switch {
	case v == NetNSAuto || v == NetNSHost || filepath.IsAbs(v):
	case strings.HasPrefix(v, "pid:"):
		if n, err := strconv.Atoi(strings.TrimPrefix(v, "pid:")); err != nil || n <= 0 {
			p.errorf(line, "netns %q: want pid:N with N a process id", v)
		}
	case v == "" || strings.ContainsAny(v, "/ "):
		p.errorf(line, "netns %q: want auto, host, a name under /run/netns, an absolute path to a namespace file, or pid:N", v)
	}
}

func (p *parser) checkCPUs(line int, v string) {
	cpus, err := cpuset.ParseList(v)
	if err == nil {
		err = cpuset.Check(cpus)
	}
	if err != nil {
		p.errorf(line, "cpus: %v", err)
	}
}

func (p *parser) mode(docLine, line int, mode string) plan.Planner {
	if line == 0 {
		p.errorf(docLine, "no mode: add a line like \"mode: rps\" (modes: %s)", strings.Join(plan.Modes(), ", "))
		return nil
	}
	if mode == "" {
		return nil // reported by scalar
	}
	pl, err := plan.Lookup(mode)
	if err != nil {
		p.errorf(line, "%v", err)
		return nil
	}
	return pl
}

// settings reads the settings mapping: every value a single one, kept as
// written (YAML's true and 70 become "true" and "70", as on the command
// line).
func (p *parser) settings(n *yaml.Node) (map[string]string, map[string]int) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "settings: want a mapping of the mode's settings (KEY: VALUE lines, `lanes modes` lists them), not %s", kindName(n))
		return nil, nil
	}
	out, lines := map[string]string{}, map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			p.errorf(k.Line, "a setting's name must be a plain word, not %s", kindName(k))
			continue
		}
		if first, dup := lines[k.Value]; dup {
			p.errorf(k.Line, "setting %q given twice (first on line %d): keep one", k.Value, first)
			continue
		}
		lines[k.Value] = k.Line
		if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
			p.errorf(v.Line, "setting %s: want a single value, not %s", k.Value, kindName(v))
			continue
		}
		out[k.Value] = v.Value
	}
	if len(out) == 0 {
		return nil, lines
	}
	return out, lines
}

// checkSettings checks setting keys with plan.CheckParams and values with
// the mode's own planner. Planners parse their settings before they look
// at the host: planned for a host with no overlay, a plan fails either on
// a setting or, as it does without any setting, on the missing overlay.
// A setting that fails alone is tried again beside the settings that pass
// alone (one setting can be bounded by another: falcon's home-room by its
// threshold), and reported at its own line if it still fails; what fails
// only all together is reported at settings:. It returns whether every
// setting passed.
func (p *parser) checkSettings(pl plan.Planner, settings map[string]string, line int, lines map[string]int) bool {
	keys := slices.Collect(maps.Keys(settings))
	sort.Slice(keys, func(i, j int) bool { return lines[keys[i]] < lines[keys[j]] })
	ok := true
	var known []string
	for _, k := range keys {
		if err := plan.CheckParams(pl, map[string]string{k: settings[k]}); err != nil {
			p.errorf(lines[k], "%v", err)
			ok = false
			continue
		}
		known = append(known, k)
	}
	online, err := cpuset.Online()
	if err != nil {
		p.errorf(line, "settings: %v", err)
		return false
	}
	base := dryPlan(pl, online, nil)
	fails := func(params map[string]string) error {
		if err := dryPlan(pl, online, params); err != nil && !sameErr(err, base) {
			return err
		}
		return nil
	}
	good := map[string]string{}
	var bad []string
	for _, k := range known {
		if fails(map[string]string{k: settings[k]}) != nil {
			bad = append(bad, k)
		} else {
			good[k] = settings[k]
		}
	}
	for _, k := range bad {
		with := maps.Clone(good)
		with[k] = settings[k]
		if err := fails(with); err != nil {
			p.errorf(lines[k], "%v", err)
			ok = false
		}
	}
	if ok {
		if err := fails(settings); err != nil {
			p.errorf(line, "settings: %v", err)
			ok = false
		}
	}
	return ok
}

func dryPlan(pl plan.Planner, online []int, params map[string]string) error {
	_, err := pl.Plan(&topology.Topology{}, plan.Config{CPUs: online, Online: online, Params: params})
	return err
}

func sameErr(a, b error) bool { return b != nil && a.Error() == b.Error() }

func (p *parser) prio(n *yaml.Node) []steer.Rule {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(n.Line, "prio: want a list of rules, one \"- [dst|src] ADDR [port N] [tcp|udp]\" a line, not %s", kindName(n))
		return nil
	}
	var out []steer.Rule
	seen := map[steer.Rule]int{}
	for _, item := range n.Content {
		item = deref(item)
		if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
			p.errorf(item.Line, "prio: a rule is one line of text like \"dst 198.18.2.21 port 11111 udp\", not %s", kindName(item))
			continue
		}
		r, err := steer.ParseRule(item.Value)
		if err != nil {
			p.errorf(item.Line, "%v", err)
			continue
		}
		if first, dup := seen[r]; dup {
			p.errorf(item.Line, "priority rule %s given twice (first on line %d): keep one", r, first)
			continue
		}
		seen[r] = item.Line
		out = append(out, r)
	}
	return out
}

func (p *parser) agent(n *yaml.Node, a *Agent) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n.Line, "agent: want a mapping (%s), not %s", strings.Join(agentKeys, ", "), kindName(n))
		return
	}
	m := p.mapping(n, "agent.", agentKeys)
	if v := m["metrics-addr"]; v != nil {
		if s, ok := p.scalar(v, "agent.metrics-addr"); ok {
			if err := checkAddr(s); err != nil {
				p.errorf(v.Line, "agent.metrics-addr %q: %v", s, err)
			} else {
				a.MetricsAddr = s
			}
		}
	}
	if v := m["on-exit"]; v != nil {
		if s, ok := p.scalar(v, "agent.on-exit"); ok {
			if s != OnExitReset && s != OnExitKeep {
				p.errorf(v.Line, "agent.on-exit %q: want reset (put every knob back when the agent stops) or keep (leave the mode applied)", s)
			} else {
				a.OnExit = s
			}
		}
	}
}

// checkAddr accepts HOST:PORT (HOST may be empty: every address) and "",
// which turns the server off.
func checkAddr(s string) error {
	if s == "" {
		return nil
	}
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want HOST:PORT like %s, or \"\" for no server", DefaultMetricsAddr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && port != "0") {
		return fmt.Errorf("port %q is not a number 0..65535", port)
	}
	return nil
}

// prioModes are the modes with priority classes at their defaults.
func prioModes() []string {
	var out []string
	for _, m := range plan.Modes() {
		if plan.Prioritizes(m, nil) {
			out = append(out, m)
		}
	}
	return out
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("the value %q", n.Value)
	}
	return "this"
}

// nearest is the known word within two edits of w, if one is.
func nearest(w string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := editDistance(w, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
