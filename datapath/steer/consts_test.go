//go:build linux

package steer

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestConstsMatchC holds every constant the Go side copies by hand from the
// BPF C sources (datapath/steer/bpf, datapath/bpf/include) to them: the mode's flags (bpf/mode.h), steer_cfg's flags,
// the stages, cpu_idx and stay values (bpf/consts.h), the hash's and flow
// state's bits (bpf/flow.h, maps.h, mflow.h, order.h), the fast path out's
// device roles (bpf/fastout.h), the XDP metadata (lanes_meta.h), the tests'
// header lengths and ECN codepoints (bpf/outer.h), the maps' sizes, and the
// counters in bpf/counters.h's enum order.
//
// The object keeps no #define and, as nothing it emits has the type, no
// enum counter in its BTF, so the C side is read from the headers'
// text: each row's C expression is evaluated over their #defines (and
// the sizes of their simple structs). What the compiled object does keep
// is checked there too: the maps' sizes (NUM_COUNTERS through
// steer_stats') and steer_cfg's arrays (MAX_CPUS) in its BTF.
func TestConstsMatchC(t *testing.T) {
	c := readCDefs(t)
	for _, r := range []struct {
		c     string // a C expression over the headers' #defines
		goVal uint64
	}{
		// bpf/mode.h: steer_mode.flags.
		{"MODE_PRIO", modePrio},
		{"MODE_COUNT_SPLIT", modeCountSplit},
		{"MODE_MFLOW", modeMFlow},
		{"MODE_MFLOW_BRIDGE", modeMFlowBridge},
		{"MODE_NO_BRIDGE_COUNT", modeNoBridgeCount},
		{"MODE_SYNC", modeSync},
		{"MODE_PRIO_IDLE_INLINE", modePrioIdleInline},
		{"MODE_VETH_CLASS", modeVethClass},
		{"MODE_STAY_QUEUED", modeStayQueued},
		{"MODE_FAST", modeFast},
		{"MODE_FAST_NO_GSO", modeFastNoGSO},
		{"MODE_FAST_BESIDE", modeFastBeside},
		// bpf/consts.h: the stages, the table, the core set.
		{"STAGE_SPLIT", StageSplit},
		{"STAGE_BRIDGE", StageBridge},
		{"STAGE_CONTAINER", StageContainer},
		{"NUM_STAGES", NumStages},
		{"BUCKETS", Buckets},
		{"MAX_CPUS", MaxCPUs},
		{"STAY", uint64(Stay)},
		// bpf/consts.h: steer_cfg.flags.
		{"CFG_ENABLED", cfgEnabled},
		{"CFG_HOME(0)", cfgHome},
		{"CFG_HOME_BARE", cfgHomeBare},
		// bpf/consts.h: a flow's cpu_idx and stay.
		{"CLASS_HI", classHi},
		{"SYNC_IDX", syncIdx},
		{"STAY_FRESH", stayFresh},
		{"STAY_QUEUED", stayQueued},
		{"STAY_DIRECT", stayDirect},
		{"STAY_MODE", stayMode},
		// bpf/flow.h, maps.h, mflow.h, order.h.
		{"HASH_COUNTED", hashCounted},
		{"HASH_EPOCHS", HashEpochs},
		{"EPOCH_SLOTS", epochSlots},
		{"MF_SEEN", mfSeen},
		{"MF_BIG", mfBig},
		{"UNCOUNTED", Uncounted},
		// bpf/fastout.h: steer_fastout_dev's roles.
		{"FASTOUT_VETH", fastOutVeth},
		{"FASTOUT_UNDERLAY", fastOutUnderlay},
		// datapath/bpf/include/lanes_meta.h.
		{"LANES_META_MAGIC", metaMagic},
		{"LANES_META_QUEUED", metaQueued},
		{"LANES_META_MFLOW", metaMFlow},
		{"LANES_META_QUEUED | LANES_META_MFLOW", metaFlagMask},
		{"LANES_META_EPOCH_SHIFT", metaEpochShift},
		{"LANES_META_QID_SHIFT", metaQIDShift},
		{"LANES_META_GEN_SHIFT", metaGenShift},
		{"sizeof(struct lanes_meta)", metaLen},
		{"sizeof(struct lanes_meta_mflow)", metaMFLen},
		// bpf/outer.h, as the tests build frames.
		{"OUTER_LEN", fastOuterLen},
		{"ECN_NOT_ECT", ecnNotECT},
		{"ECN_ECT_1", ecnECT1},
		{"ECN_ECT_0", ecnECT0},
		{"ECN_CE", ecnCE},
	} {
		got, err := c.eval(r.c)
		if err != nil {
			t.Errorf("%s: %v", r.c, err)
		} else if got != r.goVal {
			t.Errorf("%s is %#x in C, %#x in Go", r.c, got, r.goVal)
		}
		delete(c.unmirrored, r.c)
	}
	// Every flag Go sets must be Go's too: a new one in C needs a row.
	for name, file := range c.unmirrored {
		t.Errorf("%s (%s) has no row here: does Go set it?", name, file)
	}

	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	// The maps' sizes, as the compiled object has them.
	for _, r := range []struct {
		m    string
		size int
	}{
		{steerMapSteerVni, maxVNIs},
		{steerMapSteerPrio, maxRules},
		{steerMapSteerSync, maxSync},
		{steerMapSteerSyncSrc, maxSync},
		{steerMapSteerSyncLocal, maxSyncLocal},
		{steerMapSteerFastVxlan, maxFastVXLANs},
		{steerMapSteerFastoutVxlan, maxFastVXLANs},
		{steerMapSteerFastDev, maxFastVeths},
		{steerMapSteerFastoutDev, maxFastVeths},
		{steerMapSteerTable, NumStages * Buckets},
		{steerMapSteerEpochs, NumStages * epochSlots},
		{steerMapSteerCpumap, MaxCPUs},
		{steerMapSteerCpumapHi, MaxCPUs},
		{steerMapSteerMfCores, MaxCPUs},
		{steerMapSteerQueues, MaxCPUs},
		{steerMapSteerQueueLost, MaxCPUs},
		{steerMapSteerStats, NumStages * numCounters},
	} {
		if ms := spec.Maps[r.m]; ms == nil {
			t.Errorf("the object has no map %s", r.m)
		} else if ms.MaxEntries != uint32(r.size) {
			t.Errorf("%s holds %d entries in the object, %d in Go", r.m, ms.MaxEntries, r.size)
		}
	}
	// steer_cfg's per-core arrays, which Go indexes below MaxCPUs, in
	// the object's BTF.
	var cfg *btf.Struct
	if err := spec.Types.TypeByName("steer_cfg", &cfg); err != nil {
		t.Fatal(err)
	}
	perCore := map[string]bool{"cpus": true, "rps_lo": true, "index_of": true, "mf_cores": true, "prev_rps_lo": true}
	for _, m := range cfg.Members {
		if !perCore[m.Name] {
			continue
		}
		delete(perCore, m.Name)
		if a, ok := m.Type.(*btf.Array); !ok || a.Nelems != MaxCPUs {
			t.Errorf("steer_cfg.%s is %v in the object, want MaxCPUs (%d) entries", m.Name, m.Type, MaxCPUs)
		}
	}
	for m := range perCore {
		t.Errorf("the object's steer_cfg has no %s", m)
	}

	// The counters: Counters.fields() in enum counter's order, one row
	// per enumerator, and every field of Counters once.
	counters := []struct{ c, field string }{
		{"CNT_STEERED", "Steered"},
		{"CNT_STAYED", "Stayed"},
		{"CNT_PASSED", "Passed"},
		{"CNT_HELD", "Held"},
		{"CNT_MOVED", "Moved"},
		{"CNT_DISABLED", "Disabled"},
		{"CNT_UNDRAINED", "Undrained"},
		{"CNT_HIGH", "High"},
		{"CNT_MF_FRAMES", "MicroFrames"},
		{"CNT_MF_STARTED", "MicroFlows"},
		{"CNT_MF_ELEPHANT", "Elephants"},
		{"CNT_MF_ENDED", "ElephantsEnd"},
		{"CNT_MF_ARRIVED", "MicroArrived"},
		{"CNT_MF_LATE", "MicroLate"},
		{"CNT_SYNC", "Sync"},
		{"CNT_SYNC_MISS", "SyncMiss"},
		{"CNT_HOME", "Home"},
		{"CNT_SETTLED", "Settled"},
		{"CNT_DROPPED", "Dropped"},
		{"CNT_DIRECT", "Direct"},
		{"CNT_BULK_BESIDE", "BulkBeside"},
		{"CNT_UNMARKED", "Unmarked"},
		{"CNT_SYNC_REFUSED", "SyncRefused"},
		{"CNT_SYNC_EXPIRED", "SyncExpired"},
		{"CNT_SYNC_DROPPED", "SyncDropped"},
		{"CNT_ASIDE", "Aside"},
		{"CNT_REMADE", "Remade"},
		{"CNT_FAST", "Fast"},
		{"CNT_FAST_NO_ENTRY", "FastNoEntry"},
		{"CNT_FAST_OTHER", "FastOther"},
		{"CNT_FAST_REFUSED", "FastRefused"},
		{"CNT_FAST_GSO", "FastGSO"},
		{"CNT_FAST_STALE", "FastStale"},
		{"CNT_FAST_LEASE", "FastLease"},
		{"CNT_FAST_IDLE", "FastIdle"},
		{"CNT_FAST_ENDED", "FastEnded"},
		{"CNT_FAST_DROPPED", "FastDropped"},
		{"CNT_FAST_ADMITTED", "FastAdmitted"},
		{"CNT_FAST_UNLEARNED", "FastUnlearned"},
		{"CNT_FAST_BEHIND", "FastBehind"},
		{"CNT_FASTOUT", "FastOut"},
		{"CNT_FASTOUT_NO_ENTRY", "FastOutNoEntry"},
		{"CNT_FASTOUT_OTHER", "FastOutOther"},
		{"CNT_FASTOUT_REFUSED", "FastOutRefused"},
		{"CNT_FASTOUT_STALE", "FastOutStale"},
		{"CNT_FASTOUT_LEASE", "FastOutLease"},
		{"CNT_FASTOUT_IDLE", "FastOutIdle"},
		{"CNT_FASTOUT_ENDED", "FastOutEnded"},
		{"CNT_FASTOUT_DROPPED", "FastOutDropped"},
		{"CNT_FASTOUT_ADMITTED", "FastOutAdmitted"},
		{"CNT_FASTOUT_UNLEARNED", "FastOutUnlearned"},
	}
	enum := cEnum(t, "bpf/counters.h", "counter")
	if len(enum) == 0 || enum[len(enum)-1] != "NUM_COUNTERS" {
		t.Fatalf("enum counter %v does not end in NUM_COUNTERS", enum)
	}
	enum = enum[:len(enum)-1]
	var cs Counters
	fields := cs.fields()
	names := map[*uint64]string{}
	v := reflect.ValueOf(&cs).Elem()
	for i := range v.NumField() {
		names[v.Field(i).Addr().Interface().(*uint64)] = v.Type().Field(i).Name
	}
	if len(enum) != len(counters) || len(enum) != len(fields) || len(fields) != numCounters || len(names) != len(fields) {
		t.Errorf("enum counter has %d counters, the rows here %d, Counters.fields() %d, numCounters %d, Counters %d fields",
			len(enum), len(counters), len(fields), numCounters, len(names))
	}
	seen := map[string]bool{}
	for i := range max(len(enum), len(counters), len(fields)) {
		var e, row, f string
		if i < len(enum) {
			e = enum[i]
		}
		if i < len(counters) {
			row = counters[i].c + " -> " + counters[i].field
		}
		if i < len(fields) {
			f = names[fields[i]]
			if seen[f] {
				t.Errorf("Counters.fields() has %s twice", f)
			}
			seen[f] = true
		}
		if i >= len(enum) || i >= len(counters) || i >= len(fields) || counters[i].c != e || counters[i].field != f {
			t.Errorf("counter %d: enum counter has %q, the row is %q, Counters.fields() has %q", i, e, row, f)
		}
	}
}

// cDefs is what the steer object's headers define: their #defines and
// their simple structs (fixed-width fields, no nesting but of another
// such struct).
type cDefs struct {
	macros  map[string]cMacro
	structs map[string]string // name -> body
	// unmirrored is the #defines whose prefix says Go must mirror them
	// (mirroredPrefixes), until a row claims them, and their files. A
	// function-like one's row calls it with 0: CFG_HOME(0).
	unmirrored map[string]string
}

type cMacro struct {
	params []string // nil: an object-like macro
	body   string
	file   string
	dup    bool // defined again, otherwise
}

// mirroredPrefixes are the #defines Go has to mirror all of: the flags it
// sets and the stages it names.
var mirroredPrefixes = []string{"MODE_", "CFG_", "STAGE_"}

// cWire is what the headers take from the kernel's UAPI headers: wire
// formats' sizes.
var cWire = map[string]uint64{
	"ETH_HLEN":      14,
	"struct iphdr":  20,
	"struct udphdr": 8,
}

var (
	cBlockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	cLineComment  = regexp.MustCompile(`//.*`)
	cDefine       = regexp.MustCompile(`(?m)^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(\(([^)]*)\))?[ \t]*(.*)$`)
	cIdent        = regexp.MustCompile(`^[A-Za-z_]\w*$`)
	cStruct       = regexp.MustCompile(`\bstruct\s+([A-Za-z_]\w*)\s*\{([^{}]*)\}\s*;`)
)

// readCDefs reads the headers and sources the steer object is built
// from (gen.go: bpf/, steer.c, datapath/bpf/include).
func readCDefs(t *testing.T) *cDefs {
	t.Helper()
	var files []string
	for _, g := range []string{"bpf/*.h", "bpf/*.c", "*.c", "../bpf/include/*.h"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	c := &cDefs{macros: map[string]cMacro{}, structs: map[string]string{}, unmirrored: map[string]string{}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "\\\n", " ")
		s = cBlockComment.ReplaceAllString(s, " ")
		s = cLineComment.ReplaceAllString(s, "")
		for _, m := range cDefine.FindAllStringSubmatch(s, -1) {
			d := cMacro{body: strings.TrimSpace(m[4]), file: f}
			if m[2] != "" {
				d.params = []string{}
				for p := range strings.SplitSeq(m[3], ",") {
					d.params = append(d.params, strings.TrimSpace(p))
				}
			}
			if old, ok := c.macros[m[1]]; ok {
				d.dup = old.dup || old.body != d.body || !reflect.DeepEqual(old.params, d.params)
			}
			c.macros[m[1]] = d
			for _, p := range mirroredPrefixes {
				if !strings.HasPrefix(m[1], p) {
					continue
				}
				if d.params != nil {
					c.unmirrored[m[1]+"(0)"] = f
				} else {
					c.unmirrored[m[1]] = f
				}
			}
		}
		for _, m := range cStruct.FindAllStringSubmatch(s, -1) {
			if old, ok := c.structs[m[1]]; ok && old != m[2] {
				t.Fatalf("struct %s is defined twice, differently (again in %s)", m[1], f)
			}
			c.structs[m[1]] = m[2]
		}
	}
	return c
}

// cEnum lists the enumerators of enum name in file, in order. They must
// take their values from their places (no "= value").
func cEnum(t *testing.T, file, name string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := cLineComment.ReplaceAllString(cBlockComment.ReplaceAllString(string(b), " "), "")
	m := regexp.MustCompile(`\benum\s+` + name + `\s*\{([^}]*)\}`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no enum %s in %s", name, file)
	}
	var out []string
	for e := range strings.SplitSeq(m[1], ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		if !cIdent.MatchString(e) {
			t.Fatalf("enum %s: %q is not a bare enumerator", name, e)
		}
		out = append(out, e)
	}
	return out
}

// eval evaluates a C integer constant expression over the #defines:
// literals, macros (function-like too), sizeof(struct ...), unary - and
// ~, and the binary * / + - << >> & ^ |, in unsigned 64-bit arithmetic.
func (c *cDefs) eval(expr string) (v uint64, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(cEvalError)
			if !ok {
				panic(r)
			}
			err = e
		}
	}()
	return c.evalIn(expr, nil, 0), nil
}

type cEvalError struct{ error }

func cFail(format string, a ...any) {
	panic(cEvalError{fmt.Errorf(format, a...)})
}

var cToken = regexp.MustCompile(`\s*(0[xX][0-9a-fA-F]+[uUlL]*|[0-9]+[uUlL]*|[A-Za-z_]\w*|<<|>>|[-+*/&|^~(),])`)

func (c *cDefs) evalIn(expr string, env map[string]uint64, depth int) uint64 {
	if depth > 32 {
		cFail("macros nest too deep in %q", expr)
	}
	var toks []string
	rest := expr
	for strings.TrimSpace(rest) != "" {
		m := cToken.FindStringSubmatchIndex(rest)
		if m == nil || m[0] != 0 {
			cFail("cannot read %q", rest)
		}
		toks = append(toks, rest[m[2]:m[3]])
		rest = rest[m[1]:]
	}
	p := &cParser{c: c, toks: toks, env: env, depth: depth}
	v := p.binary(0)
	if p.i != len(toks) {
		cFail("%q: unexpected %q", expr, toks[p.i])
	}
	return v
}

type cParser struct {
	c     *cDefs
	toks  []string
	i     int
	env   map[string]uint64
	depth int
}

// cLevels are C's binary operators, loosest first.
var cLevels = [][]string{{"|"}, {"^"}, {"&"}, {"<<", ">>"}, {"+", "-"}, {"*", "/"}}

func (p *cParser) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return ""
}

func (p *cParser) next() string {
	t := p.peek()
	if t == "" {
		cFail("%v: unexpected end", p.toks)
	}
	p.i++
	return t
}

func (p *cParser) expect(t string) {
	if got := p.next(); got != t {
		cFail("%v: %q where %q belongs", p.toks, got, t)
	}
}

func (p *cParser) binary(level int) uint64 {
	if level == len(cLevels) {
		return p.unary()
	}
	v := p.binary(level + 1)
	for {
		op := p.peek()
		found := false
		for _, o := range cLevels[level] {
			found = found || o == op
		}
		if !found {
			return v
		}
		p.i++
		w := p.binary(level + 1)
		switch op {
		case "|":
			v |= w
		case "^":
			v ^= w
		case "&":
			v &= w
		case "<<":
			v <<= w
		case ">>":
			v >>= w
		case "+":
			v += w
		case "-":
			v -= w
		case "*":
			v *= w
		case "/":
			if w == 0 {
				cFail("%v: division by zero", p.toks)
			}
			v /= w
		}
	}
}

func (p *cParser) unary() uint64 {
	switch t := p.next(); {
	case t == "-":
		return -p.unary()
	case t == "~":
		return ^p.unary()
	case t == "(":
		v := p.binary(0)
		p.expect(")")
		return v
	case t == "sizeof":
		p.expect("(")
		p.expect("struct")
		name := p.next()
		p.expect(")")
		return p.c.sizeof(name, p.depth)
	case t[0] >= '0' && t[0] <= '9':
		v, err := strconv.ParseUint(strings.TrimRight(t, "uUlL"), 0, 64)
		if err != nil {
			cFail("%q: %v", t, err)
		}
		return v
	default:
		if v, ok := p.env[t]; ok {
			return v
		}
		if v, ok := cWire[t]; ok {
			return v
		}
		m, ok := p.c.macros[t]
		switch {
		case !ok:
			cFail("%s is not defined", t)
		case m.dup:
			cFail("%s is defined more than once, differently", t)
		case m.params == nil:
			return p.c.evalIn(m.body, nil, p.depth+1)
		}
		p.expect("(")
		env := map[string]uint64{}
		for i, name := range m.params {
			if i > 0 {
				p.expect(",")
			}
			env[name] = p.binary(0)
		}
		p.expect(")")
		return p.c.evalIn(m.body, env, p.depth+1)
	}
}

// cFieldSizes are the sizes of the fixed-width types a simple struct's
// fields may have.
var cFieldSizes = map[string]uint64{
	"__u8": 1, "__s8": 1,
	"__u16": 2, "__s16": 2, "__be16": 2,
	"__u32": 4, "__s32": 4, "__be32": 4,
	"__u64": 8, "__s64": 8, "__be64": 8,
}

var cField = regexp.MustCompile(`^(struct\s+[A-Za-z_]\w*|[A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*(?:\[([^\]]+)\])?$`)

// sizeof is sizeof(struct name): a wire format's, or that of a simple
// struct of the headers, laid out with natural alignment.
func (c *cDefs) sizeof(name string, depth int) uint64 {
	size, _ := c.layout(name, depth)
	return size
}

func (c *cDefs) layout(name string, depth int) (size, align uint64) {
	if v, ok := cWire["struct "+name]; ok {
		return v, min(v, 4)
	}
	body, ok := c.structs[name]
	if !ok {
		cFail("struct %s is not defined", name)
	}
	align = 1
	for f := range strings.SplitSeq(body, ";") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		m := cField.FindStringSubmatch(f)
		if m == nil {
			cFail("struct %s: cannot size the field %q", name, f)
		}
		var fs, fa uint64
		if s, ok := strings.CutPrefix(m[1], "struct"); ok {
			fs, fa = c.layout(strings.TrimSpace(s), depth+1)
		} else if fs, ok = cFieldSizes[m[1]]; ok {
			fa = fs
		} else {
			cFail("struct %s: cannot size the type %s", name, m[1])
		}
		if m[3] != "" {
			fs *= c.evalIn(m[3], nil, depth+1)
		}
		size = (size+fa-1)/fa*fa + fs
		align = max(align, fa)
	}
	return (size + align - 1) / align * align, align
}
