//go:build linux

package steer

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/datapath/knobs"
	"golang.org/x/sys/unix"
)

// Prio is PRISM's classification (bpf/prio.h, veth.c): the rules,
// high=auto's switches, the quiet clocks, the per-class container queues.
type Prio struct{ *core }

func (d *Datapath) Prio() Prio { return Prio{d.core} }

// HighInline lists the rules whose flows run their first stage in the NIC
// poll now (SetHighInline), empty unless the config has high=auto
// (Config.HighAutoPPS), without which the programs ignore the switches.
func (d Prio) HighInline() ([]Rule, error) {
	_, on, err := d.HighAuto()
	return on, err
}

// HighAuto reads high=auto's threshold from the config (0: off) and the
// rules whose flows run in the NIC poll now (HighInline).
func (d Prio) HighAuto() (pps uint32, inline []Rule, err error) {
	pps = d.mode.HighAutoPps
	on, err := d.highSwitches()
	if err != nil || pps == 0 {
		return pps, nil, err
	}
	return pps, on, nil
}

// highSwitches reads steer_high_inline alone: the rules whose switch
// SetHighInline set and whose deadline has not passed (heeded only under
// a config with high=auto), in Rules' order.
func (d *core) highSwitches() ([]Rule, error) {
	now := Now()
	return rulesIn(d.objs.SteerHighInline, "the high-priority switches", func(until uint64) bool { return until != 0 && time.Duration(until) > now })
}

// SetHighInline switches where the flows rule r marks run their first
// stage: until the deadline (CLOCK_MONOTONIC, as Now), in the NIC poll
// that classified them (PRISM's high=inline); once it passed, or with 0,
// in the receive core's high-priority queue (high=queue). It is runtime
// state of PRISM's high=auto (lanes agent), which renews the deadline at
// every sample, as SetAside's, so the switches of an agent that dies lapse
// with it; in a map of its own, so that writing it never rewrites what
// lanes prio and apply write. The programs heed it only while the config
// has Config.HighAutoPPS, which needs Config.PrioIdleInline: there
// steer_xdp moves each flow between the queue and the NIC poll as soon as
// none of its frames is left on the old path (place()'s PLACE_LOCAL), so
// the switch (and its lapsing) never reorders a flow; without it a busy
// flow would wait for an idle gap. A flow marked by several rules goes by
// the first that steer_xdp finds (MarkingRule). Switching on is refused
// without high=auto in the config; off always works.
func (d Prio) SetHighInline(r Rule, until time.Duration) error {
	if err := r.check(); err != nil {
		return err
	}
	if until == 0 {
		if err := d.objs.SteerHighInline.Delete(r.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clearing the high-priority switch of %s: %w", r, err)
		}
		return nil
	}
	if d.mode.HighAutoPps == 0 {
		return errors.New("high-priority flows switch to the NIC poll only under high=auto (Config.HighAutoPPS), which the applied config does not have")
	}
	if err := d.objs.SteerHighInline.Put(r.key(), uint64(until)); err != nil {
		return fmt.Errorf("writing the high-priority switch of %s: %w", r, err)
	}
	// A rule deleted meanwhile (lanes prio del drops its switch, maybe
	// just before this Put) must not keep one: added again, it would
	// start inline.
	var one uint8
	if err := d.objs.SteerPrio.Lookup(r.key(), &one); errors.Is(err, ebpf.ErrKeyNotExist) {
		if err := d.SetHighInline(r, 0); err != nil {
			return err
		}
		return fmt.Errorf("priority rule %s: deleted while its high-priority switch was set", r)
	}
	return nil
}

// SetAside stands PRISM aside until the deadline (CLOCK_MONOTONIC, as
// Now; 0 ends it at once): steer_xdp runs both classes' first stage in
// the NIC poll, as vanilla runs it, while the deadline has not passed.
// Runtime state of lanes agent (PRISM's aside-below), which renews the
// deadline at every sample: an agent that dies leaves the plan's
// placement back once it passes. The moves there and back are the fast
// moves SetHighInline's are, in order; the programs heed it only while
// the config has Config.AsideBelow, and setting it is refused without.
func (d Prio) SetAside(until time.Duration) error {
	if until != 0 && d.mode.AsidePct == 0 {
		return errors.New("PRISM steps aside only with aside-below (Config.AsideBelow), which the applied config does not have")
	}
	if err := d.objs.SteerAside.Put(uint32(0), uint64(until)); err != nil {
		return fmt.Errorf("writing PRISM's aside deadline: %w", err)
	}
	return nil
}

// Aside says whether PRISM stands aside now (SetAside's deadline has not
// passed, under a config with Config.AsideBelow).
func (d Prio) Aside() (bool, error) {
	var until uint64
	if err := d.objs.SteerAside.Lookup(uint32(0), &until); err != nil {
		return false, fmt.Errorf("reading PRISM's aside deadline: %w", err)
	}
	return d.mode.AsidePct != 0 && until != 0 && time.Duration(until) > Now(), nil
}

// AsideConfig is the applied config's aside-below (percent; 0: off) and
// the receive core it is measured on (Config.InlineCPU).
func (d Prio) AsideConfig() (below uint32, core int) {
	return d.mode.AsidePct, int(d.mode.InlineCpu)
}

// AsideDepth is the applied config's aside-depth, hundredths of a frame
// per NIC poll (Config.AsideDepth; 0: receive work alone).
func (d Prio) AsideDepth() uint32 { return d.mode.AsideDepth }

// clearHighInline puts every rule's flows back in the high-priority queue
// (every switch written, lapsed or not).
func (d *core) clearHighInline() error {
	on, err := rulesIn(d.objs.SteerHighInline, "the high-priority switches", func(uint64) bool { return true })
	if err != nil {
		return err
	}
	for _, r := range on {
		if err := (Prio{d}).SetHighInline(r, 0); err != nil {
			return err
		}
	}
	return nil
}

// ForgetHigh drops what high=auto keeps for rule r (its switch and its
// frame count), for a rule that is gone.
func (d Prio) ForgetHigh(r Rule) error {
	if err := d.SetHighInline(r, 0); err != nil {
		return err
	}
	if err := d.objs.SteerHighFrames.Delete(r.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("dropping the frame count of %s: %w", r, err)
	}
	return nil
}

// HighRuleFrames is the number of frames each rule marked, summed over
// cores, counted by steer_xdp only while the config has high=auto: lanes
// agent's rate of each rule. A rule appears with its first frame.
func (d Prio) HighRuleFrames() (map[Rule]uint64, error) {
	out := map[Rule]uint64{}
	var (
		k   steerPrioRule
		per []uint64
	)
	it := d.objs.SteerHighFrames.Iterate()
	for it.Next(&k, &per) {
		var n uint64
		for _, v := range per {
			n += v
		}
		out[ruleOf(k)] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the high-priority frame counts: %w", err)
	}
	return out, nil
}

// highAutoMaps are what high=auto's switch reads and writes: the config,
// the rules, their frame counts, their switches, the aside deadline and
// when bulk was last seen.
var highAutoMaps = []string{steerMapSteerCfg, steerMapSteerPrio, steerMapSteerHighFrames, steerMapSteerHighInline, steerMapSteerAside, steerMapSteerBulkSeen}

// OpenHighAuto reopens only highAutoMaps (and the mode, which the config
// is read with).
func OpenHighAuto(dir string) (*Datapath, error) {
	if !Pinned(dir) {
		return nil, fmt.Errorf("steer datapath in %s: %w", dir, knobs.ErrGone)
	}
	d, _, err := openMaps(dir, highAutoMaps)
	return d, err
}

// HighAutoStamp identifies the datapath OpenHighAuto opens as pinned
// now: the inode numbers and change times of its config's pin and of the
// mode's. Pins are never changed in place, and bpffs numbers new inodes
// from a counter: a new datapath is pinned only where every pin of the
// last one was removed (Pin refuses otherwise), so its config pin is new
// too, and a mode change (setMode) pins a new mode map over the same
// maps. A holder of an OpenHighAuto whose stamp still matches holds what
// is pinned; one that opens half a new datapath's pins fails and opens
// again. Two stats, where reopening costs an object get, an info query
// and a close for each of seven maps: high=auto samples ten times a
// second.
func HighAutoStamp(dir string) (string, error) {
	var b strings.Builder
	for _, name := range []string{steerMapSteerCfg, PinMode} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, name), &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return "", fmt.Errorf("steer datapath in %s: %w", dir, knobs.ErrGone)
			}
			return "", fmt.Errorf("steer datapath in %s: %w", dir, err)
		}
		fmt.Fprintf(&b, "%d:%d.%d ", st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return b.String(), nil
}

// Rule marks inner flows high priority (PRISM's IP/port database): those
// whose destination (or, with Src, source) address is Addr, and whose port
// on that side and protocol match when given.
type Rule struct {
	Src   bool       // match the source side; default the destination
	Addr  netip.Addr // IPv4
	Port  uint16     // 0: any port
	Proto uint8      // 6 (TCP), 17 (UDP), 0: any
}

// maxRules is steer_prio's size (TestConstsMatchC checks it in the object).
const maxRules = 1024

func (r Rule) check() error {
	if !r.Addr.Is4() {
		return fmt.Errorf("priority rule %s: only IPv4 addresses (the programs parse IPv4 only)", r)
	}
	if r.Proto != 0 && r.Proto != ipProtoTCP && r.Proto != ipProtoUDP {
		return fmt.Errorf("priority rule %s: protocol must be tcp, udp or any", r)
	}
	return nil
}

// IP protocol numbers a rule may name.
const (
	ipProtoTCP = 6
	ipProtoUDP = 17
)

// Matches says whether the rule marks a flow (inner addresses, ports and
// protocol), as steer_xdp's high_prio decides it.
func (r Rule) Matches(src, dst netip.Addr, sport, dport uint16, proto uint8) bool {
	addr, port := dst, dport
	if r.Src {
		addr, port = src, sport
	}
	return addr == r.Addr && (r.Port == 0 || r.Port == port) && (r.Proto == 0 || r.Proto == proto)
}

// MarkingRule is the rule by which steer_xdp's high_prio marks a flow: of
// the rules that match it, the first in the program's order (destination
// rules before source rules; port and protocol given, port only, protocol
// only, neither). ok is false when none matches. high=auto switches flows
// by this rule (Prio.SetHighInline).
func MarkingRule(rules []Rule, src, dst netip.Addr, sport, dport uint16, proto uint8) (r Rule, ok bool) {
	for _, c := range rules {
		if c.Matches(src, dst, sport, dport, proto) && (!ok || c.shape() < r.shape()) {
			r, ok = c, true
		}
	}
	return r, ok
}

// String is the rule as ParseRule reads it, e.g. "dst 198.18.0.2 port 80 tcp".
func (r Rule) String() string {
	var b strings.Builder
	if r.Src {
		b.WriteString("src ")
	} else {
		b.WriteString("dst ")
	}
	b.WriteString(r.Addr.String())
	if r.Port != 0 {
		b.WriteString(" port " + strconv.Itoa(int(r.Port)))
	}
	switch r.Proto {
	case ipProtoTCP:
		b.WriteString(" tcp")
	case ipProtoUDP:
		b.WriteString(" udp")
	}
	return b.String()
}

// ParseRule reads "[dst|src] ADDR [port N] [tcp|udp]".
func ParseRule(s string) (Rule, error) {
	var r Rule
	f := strings.Fields(s)
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("priority rule %q: %s (want [dst|src] ADDR [port N] [tcp|udp])", s, why)
	}
	if len(f) > 0 && (f[0] == "dst" || f[0] == "src") {
		r.Src = f[0] == "src"
		f = f[1:]
	}
	if len(f) == 0 {
		return bad("no address")
	}
	a, err := netip.ParseAddr(f[0])
	if err != nil || !a.Is4() {
		return bad(fmt.Sprintf("%q is not an IPv4 address", f[0]))
	}
	r.Addr = a
	for f = f[1:]; len(f) > 0; f = f[1:] {
		switch f[0] {
		case "port":
			if len(f) < 2 {
				return bad("port without a number")
			}
			p, err := strconv.ParseUint(f[1], 10, 16)
			if err != nil || p == 0 {
				return bad(fmt.Sprintf("port %q is not 1..65535", f[1]))
			}
			r.Port = uint16(p)
			f = f[1:]
		case "tcp":
			r.Proto = ipProtoTCP
		case "udp":
			r.Proto = ipProtoUDP
		default:
			return bad(fmt.Sprintf("unknown word %q", f[0]))
		}
	}
	return r, nil
}

// shape is the rule's bit in steer_cfg.prio_shapes (bpf/prio.h's high_prio):
// side, then port and protocol given or not.
func (r Rule) shape() uint32 {
	i := 3
	switch {
	case r.Port != 0 && r.Proto != 0:
		i = 0
	case r.Port != 0:
		i = 1
	case r.Proto != 0:
		i = 2
	}
	if r.Src {
		i += 4
	}
	return 1 << i
}

// prioShapes is the shape mask of the rules in the map.
func (d *core) prioShapes() (uint32, error) {
	rules, err := Prio{d}.Rules()
	if err != nil {
		return 0, err
	}
	var m uint32
	for _, r := range rules {
		m |= r.shape()
	}
	return m, nil
}

// syncPrioShapes writes the rules' shape mask (bpf/maps.h's
// steer_prio_shapes, whose one writer this is), so the programs look up
// only shapes that exist. After an add, the new shape is in the mask once
// this returns; after a delete, a stale bit only costs a lookup. It reads
// the rule set and writes the mask: callers hold the rule set's lock
// (withRules), or a mask computed from a set another writer changed
// meanwhile could replace one with its rule's shape.
func (d *core) syncPrioShapes() error {
	shapes, err := d.prioShapes()
	if err != nil {
		return err
	}
	if err := d.objs.SteerPrioShapes.Put(uint32(0), shapes); err != nil {
		return fmt.Errorf("writing the rule shapes: %w", err)
	}
	return nil
}

// Shapes reads the rule shapes the programs look up.
func (d Prio) Shapes() (uint32, error) {
	var v uint32
	if err := d.objs.SteerPrioShapes.Lookup(uint32(0), &v); err != nil {
		return 0, fmt.Errorf("reading the rule shapes: %w", err)
	}
	return v, nil
}

func (r Rule) key() steerPrioRule {
	k := steerPrioRule{Addr: nativeAddr(r.Addr), Port: nativePort(r.Port), Proto: r.Proto}
	if r.Src {
		k.Dir = 1
	}
	return k
}

// PinRulesLock is the directory in a datapath's pin directory whose lock
// (knobs.LockDir) every change of the rule set holds with the shape mask
// it writes: `lanes prio` and lanes agent are different processes. A
// directory, the one kind of file bpffs makes besides pins (and no dot:
// bpffs refuses names with one).
const PinRulesLock = "steer_prio_lock"

// rulesWait is how long a rule change waits for another to finish.
const rulesWait = 10 * time.Second

// withRules runs f, a change of the rule set and its shape mask, holding
// the rule set's lock: the pinned datapath's PinRulesLock (made on first
// use: datapaths pinned before it are locked the same), so that no other
// process's change runs between the set f reads and the mask it writes;
// a datapath pinned nowhere, only this process can reach.
func (d *core) withRules(f func() error) error {
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	if d.pinDir == "" {
		return f()
	}
	dir := filepath.Join(d.pinDir, PinRulesLock)
	if err := os.Mkdir(dir, 0o700); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("steer datapath in %s: %w (reset)", d.pinDir, knobs.ErrGone)
	} else if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("the priority rules' lock: %w", err)
	}
	lock, err := knobs.LockDir(dir, rulesWait)
	if err != nil {
		return fmt.Errorf("the priority rules' lock: %w", err)
	}
	defer lock.Close()
	return f()
}

// AddRule marks r's flows high priority from their next packet on (a flow
// changes class like any move: once its old queue has drained). Adding a
// rule that is there is not an error.
func (d Prio) AddRule(r Rule) error {
	if err := r.check(); err != nil {
		return err
	}
	return d.withRules(func() error {
		if err := d.objs.SteerPrio.Update(r.key(), uint8(1), ebpf.UpdateAny); err != nil {
			if errors.Is(err, unix.E2BIG) {
				return fmt.Errorf("adding priority rule %s: the table holds at most %d rules", r, maxRules)
			}
			return fmt.Errorf("adding priority rule %s: %w", r, err)
		}
		return d.syncPrioShapes()
	})
}

// DelRule removes r; it is an error if r is not there.
func (d Prio) DelRule(r Rule) error {
	if err := r.check(); err != nil {
		return err
	}
	err := d.withRules(func() error {
		if err := d.objs.SteerPrio.Delete(r.key()); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("no priority rule %s (lanes prio list shows them)", r)
			}
			return fmt.Errorf("removing priority rule %s: %w", r, err)
		}
		return d.syncPrioShapes()
	})
	if err != nil {
		return err
	}
	// The rule's high=auto state goes with it, so the same rule added
	// again starts in the queue with no count (the agent also drops what
	// a deleted rule left, at its next sample).
	return d.ForgetHigh(r)
}

// Rules lists the priority rules, destination rules first, then by
// address, port and protocol.
func (d Prio) Rules() ([]Rule, error) {
	return rulesIn(d.objs.SteerPrio, "priority rules", func(uint8) bool { return true })
}

// rulesIn lists, sorted as Rules, the rules keying map m (steer_prio, or a
// map of per-rule state) whose value keep accepts.
func rulesIn[V any](m *ebpf.Map, what string, keep func(V) bool) ([]Rule, error) {
	var (
		out []Rule
		k   steerPrioRule
		v   V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if keep(v) {
			out = append(out, ruleOf(k))
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	sortRules(out)
	return out, nil
}

// ruleOf is the rule a steer_prio key holds.
func ruleOf(k steerPrioRule) Rule {
	return Rule{Src: k.Dir == 1, Addr: beAddr(k.Addr), Port: bePort(k.Port), Proto: k.Proto}
}

// sortRules sorts destination rules first, then by address, port and
// protocol.
func sortRules(out []Rule) {
	slices.SortFunc(out, func(a, b Rule) int {
		src := func(r Rule) int {
			if r.Src {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(src(a), src(b)), a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto))
	})
}

// SinceHigh is how long ago steer_xdp last saw a high-priority frame, as it
// stamps them for Config.PrioQuiet (the coarse monotonic clock: a tick or
// two late); ok is false before the first one. Only stamped while
// PrioQuiet is set.
func (d Prio) SinceHigh() (since time.Duration, ok bool, err error) {
	return sinceStamp(d.objs.SteerPrioSeen, "high-priority")
}

// SinceBulk is SinceHigh for bulk frames, as steer_xdp stamps them for
// Config.BulkQuiet (only while it is set).
func (d Prio) SinceBulk() (since time.Duration, ok bool, err error) {
	return sinceStamp(d.objs.SteerBulkSeen, "bulk")
}

// BulkQuiet says whether steer_xdp takes bulk for quiet under the bulk
// quiet time q (no bulk frame yet, or none for QuietAfter(q)): then
// high-priority flows run in the NIC poll.
func (d Prio) BulkQuiet(q time.Duration) (quiet bool, since time.Duration, seen bool, err error) {
	return quietOf(d.objs.SteerBulkSeen, "bulk", q)
}

// BulkQuietNow says whether every high-priority flow runs in the NIC poll
// now for want of bulk: the config has high=auto with a bulk quiet time,
// and no bulk frame came for it.
func (d Prio) BulkQuietNow() (bool, error) {
	m := d.mode
	if m.BulkQuietMs == 0 || m.HighAutoPps == 0 {
		return false, nil
	}
	quiet, _, _, err := d.BulkQuiet(time.Duration(m.BulkQuietMs) * time.Millisecond)
	return quiet, err
}

// BulkBesideBusy says whether steer_xdp runs bulk in the NIC poll now
// beside busy marked flows (Config.BulkAuto, window w): a busy rule's
// high-priority frame ran in the NIC poll within QuietAfter(w), and none
// took its queue in that time.
func (d Prio) BulkBesideBusy(w time.Duration) (bool, error) {
	var seen steerHighSeen
	if err := d.objs.SteerHighSeen.Lookup(uint32(0), &seen); err != nil {
		return false, fmt.Errorf("reading the last high-priority frames' times: %w", err)
	}
	now, after := Now(), QuietAfter(w)
	return !quietSince(seen.Busy, now, after) && quietSince(seen.Queued, now, after), nil
}

// quietSince says whether a coarse-clock stamp (0: none yet) is more than
// after old at now, as bpf/prio.h's gap_over does.
func quietSince(stamp uint64, now, after time.Duration) bool {
	return stamp == 0 || now-time.Duration(stamp) > after
}

// sinceStamp reads a coarse-clock stamp map (steer_prio_seen,
// steer_bulk_seen) as the time since.
func sinceStamp(m *ebpf.Map, what string) (since time.Duration, ok bool, err error) {
	var last uint64
	if err := m.Lookup(uint32(0), &last); err != nil {
		return 0, false, fmt.Errorf("reading the last %s frame's time: %w", what, err)
	}
	if last == 0 {
		return 0, false, nil
	}
	return max(0, Now()-time.Duration(last)), true, nil
}

// HighQuiet says whether steer_xdp takes the high class for quiet under
// the quiet time q (no high-priority frame yet, or none for
// QuietAfter(q)), with SinceHigh's answer for those who show it.
func (d Prio) HighQuiet(q time.Duration) (quiet bool, since time.Duration, seen bool, err error) {
	return quietOf(d.objs.SteerPrioSeen, "high-priority", q)
}

// quietOf is HighQuiet and BulkQuiet for the stamp map m of their class.
func quietOf(m *ebpf.Map, what string, q time.Duration) (quiet bool, since time.Duration, seen bool, err error) {
	since, seen, err = sinceStamp(m, what)
	if err != nil {
		return false, 0, false, err
	}
	return !seen || since > QuietAfter(q), since, seen, nil
}
