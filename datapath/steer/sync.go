//go:build linux

package steer

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/datapath/knobs"
	"github.com/lanesnet/lanes/internal/netnsx"
)

// Sync is PRISM-sync's shortcut (bpf/sync.h): the destinations, local
// VTEPs and sources it may use.
type Sync struct{ *core }

func (d *Datapath) Sync() Sync { return Sync{d.core} }

// SyncTarget is one destination of PRISM-sync's shortcut: high-priority
// frames of overlay VNI whose inner destination is MAC are decapsulated in
// XDP and redirected to the host-side veth Ifindex, when their inner frame
// (Ethernet header excluded) is no longer than MTU. Which destinations are
// safe is policy's business (policy/prism); see bpf/sync.h's sync_dest.
type SyncTarget struct {
	VNI     uint32
	MAC     net.HardwareAddr
	Ifindex uint32
	MTU     uint32
}

// maxSync is steer_sync's size, and steer_sync_src's; maxSyncLocal is
// steer_sync_local's. TestConstsMatchC checks them in the object.
const (
	maxSync      = 4096
	maxSyncLocal = 256
)

// String is the target as FormatSync writes it: "VNI/MAC>IFINDEX@MTU".
func (s SyncTarget) String() string {
	return fmt.Sprintf("%d/%s>%d@%d", s.VNI, s.MAC, s.Ifindex, s.MTU)
}

func (s SyncTarget) check() error {
	switch {
	case len(s.MAC) != 6:
		return fmt.Errorf("sync target %s: MAC is not an Ethernet address", s)
	case s.MAC[0]&1 != 0:
		return fmt.Errorf("sync target %s: MAC is a group address: the shortcut delivers to one container", s)
	case s.VNI >= 1<<24:
		return fmt.Errorf("sync target %s: VNI does not fit in 24 bits", s)
	case s.Ifindex == 0 || s.MTU < 68:
		return fmt.Errorf("sync target %s: needs a device and an MTU of at least 68", s)
	}
	return nil
}

func syncKey(vni uint32, mac net.HardwareAddr) steerSyncKey {
	k := steerSyncKey{Vni: vni}
	copy(k.Mac[:], mac)
	return k
}

func (s SyncTarget) key() steerSyncKey { return syncKey(s.VNI, s.MAC) }

// SyncSource is an inner source MAC whose frames of overlay VNI may take
// the shortcut, from the VTEP address alone: a remote container behind a
// static forwarding entry of the VXLAN device (bpf/maps.h's steer_sync_src).
type SyncSource struct {
	VNI  uint32
	MAC  net.HardwareAddr
	VTEP netip.Addr
}

// String is the source as FormatSync writes it: "VNI/MAC<VTEP".
func (s SyncSource) String() string { return fmt.Sprintf("%d/%s<%s", s.VNI, s.MAC, s.VTEP) }

func (s SyncSource) check() error {
	switch {
	case len(s.MAC) != 6 || s.MAC[0]&1 != 0 || bytes.Equal(s.MAC, make([]byte, 6)):
		return fmt.Errorf("sync source %s: MAC is not a unicast Ethernet address", s)
	case s.VNI >= 1<<24:
		return fmt.Errorf("sync source %s: VNI does not fit in 24 bits", s)
	case !s.VTEP.Is4() || s.VTEP.IsUnspecified() || s.VTEP.IsMulticast() || s.VTEP.IsLoopback() || s.VTEP == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("sync source %s: the VTEP must be a unicast IPv4 address", s)
	}
	return nil
}

// SyncLocal is one of this host's VTEP addresses on an underlay device,
// with that device's MAC: the outer destination a frame must have to take
// the shortcut (bpf/maps.h's steer_sync_local).
type SyncLocal struct {
	Ifindex uint32
	Addr    netip.Addr
	MAC     net.HardwareAddr
}

// String is the local address as FormatSync writes it: "IFINDEX/ADDR=MAC".
func (l SyncLocal) String() string { return fmt.Sprintf("%d/%s=%s", l.Ifindex, l.Addr, l.MAC) }

func (l SyncLocal) check() error {
	if l.Ifindex == 0 || !l.Addr.Is4() || len(l.MAC) != 6 || l.MAC[0]&1 != 0 {
		return fmt.Errorf("sync local address %s: needs a device, an IPv4 address and the device's unicast MAC", l)
	}
	return nil
}

// SyncSet is everything the shortcut goes by: the destinations and what a
// frame must come from and to (bpf/sync.h's sync_accept).
type SyncSet struct {
	Targets []SyncTarget
	Sources []SyncSource
	Locals  []SyncLocal
	// Changes is the count of changes on the path (Datapath.Changes) read
	// before the facts the set comes from: once another change is
	// counted, the datapath takes none of its destinations. Not part of
	// the set's text (FormatSyncSet).
	Changes uint64
}

func (s SyncSet) check() error {
	if len(s.Targets) > maxSync || len(s.Sources) > maxSync || len(s.Locals) > maxSyncLocal {
		return fmt.Errorf("sync set of %d targets, %d sources, %d local addresses: at most %d, %d and %d", len(s.Targets), len(s.Sources), len(s.Locals), maxSync, maxSync, maxSyncLocal)
	}
	seen := map[string]bool{}
	for _, t := range s.Targets {
		if err := t.check(); err != nil {
			return err
		}
		if k := fmt.Sprint(t.key()); seen[k] {
			return fmt.Errorf("sync target %s listed twice", t)
		} else {
			seen[k] = true
		}
	}
	clear(seen)
	for _, src := range s.Sources {
		if err := src.check(); err != nil {
			return err
		}
		if k := fmt.Sprint(syncKey(src.VNI, src.MAC)); seen[k] {
			return fmt.Errorf("sync source %d/%s listed twice", src.VNI, src.MAC)
		} else {
			seen[k] = true
		}
	}
	for _, l := range s.Locals {
		if err := l.check(); err != nil {
			return err
		}
	}
	return nil
}

func sortSync(ts []SyncTarget) {
	slices.SortFunc(ts, func(a, b SyncTarget) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), bytes.Compare(a.MAC, b.MAC))
	})
}

func (s *SyncSet) sort() {
	sortSync(s.Targets)
	slices.SortFunc(s.Sources, func(a, b SyncSource) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), bytes.Compare(a.MAC, b.MAC))
	})
	slices.SortFunc(s.Locals, func(a, b SyncLocal) int {
		return cmp.Or(cmp.Compare(a.Ifindex, b.Ifindex), a.Addr.Compare(b.Addr))
	})
}

// be32 is an IPv4 address as a __be32 field holds it.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func addrOf(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// Set makes s the shortcut's set, replacing the previous one, with
// every destination valid for ttl from now: the datapath voids a
// destination at its deadline unless a later Set renews it, so a set
// nobody renews closes the shortcut by itself. It must run in the network
// namespace of the targets' devices: the devmap resolves an ifindex in the
// namespace of whoever writes it. New devices go into the devmap before
// any destination names them, and stale ones leave it only after no
// destination does, so a frame never finds a destination whose device the
// redirect cannot reach; sources and local addresses go in before the
// destinations and leave after them.
func (d Sync) Set(s SyncSet, ttl time.Duration) error {
	if err := s.check(); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("sync set: a lifetime of %v", ttl)
	}
	deadline := uint64(Now() + ttl)
	want := map[steerSyncKey]steerSyncDest{}
	devs := map[uint32]bool{}
	for _, t := range s.Targets {
		want[t.key()] = steerSyncDest{Ifindex: t.Ifindex, Mtu: t.MTU, Deadline: deadline, Changes: s.Changes}
		devs[t.Ifindex] = true
	}
	for ifi := range devs {
		if err := d.objs.SteerSyncDev.Put(ifi, ifi); err != nil {
			return fmt.Errorf("adding device %d to the sync devmap (is it in this namespace?): %w", ifi, err)
		}
	}
	srcs := map[steerSyncKey]steerSyncSrc{}
	for _, src := range s.Sources {
		srcs[syncKey(src.VNI, src.MAC)] = steerSyncSrc{Vtep: be32(src.VTEP)}
	}
	locals := map[steerSyncLocalKey]steerSyncLocal{}
	for _, l := range s.Locals {
		v := steerSyncLocal{}
		copy(v.Mac[:], l.MAC)
		locals[steerSyncLocalKey{Ifindex: l.Ifindex, Addr: be32(l.Addr)}] = v
	}
	if err := replaceMap(d.objs.SteerSyncLocal, locals, nil); err != nil {
		return fmt.Errorf("sync local addresses: %w", err)
	}
	// A source keeps its seen stamp across rewrites (the agent's refresh
	// of the bridge's forwarding entry reads it).
	keepSeen := func(k steerSyncKey, v *steerSyncSrc) {
		var old steerSyncSrc
		if d.objs.SteerSyncSrc.Lookup(k, &old) == nil && old.Vtep == v.Vtep {
			v.Seen = old.Seen
		}
	}
	if err := replaceMap(d.objs.SteerSyncSrc, srcs, keepSeen); err != nil {
		return fmt.Errorf("sync sources: %w", err)
	}
	if err := replaceMap(d.objs.SteerSync, want, nil); err != nil {
		return fmt.Errorf("sync targets: %w", err)
	}
	var ifi, val uint32
	var stale []uint32
	it := d.objs.SteerSyncDev.Iterate()
	for it.Next(&ifi, &val) {
		if !devs[ifi] {
			stale = append(stale, ifi)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the sync devmap: %w", err)
	}
	for _, ifi := range stale {
		if err := d.objs.SteerSyncDev.Delete(ifi); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing device %d from the sync devmap: %w", ifi, err)
		}
	}
	return nil
}

// Withdraw voids every destination at once, leaving sources and local
// addresses (which deliver nothing by themselves): what the agent does the
// moment something on the path changes, before it looks again.
func (d Sync) Withdraw() error {
	var k steerSyncKey
	var v steerSyncDest
	var keys []steerSyncKey
	it := d.objs.SteerSync.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading sync targets: %w", err)
	}
	var errs []error
	for _, k := range keys {
		if err := d.objs.SteerSync.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("withdrawing sync targets: %w", err)
	}
	return nil
}

// mapKeys lists m's keys.
func mapKeys[K comparable, V any](m *ebpf.Map) ([]K, error) {
	var keys []K
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	return keys, it.Err()
}

// replaceMap makes m hold exactly want: new and changed entries first,
// then the stale ones deleted. adjust (may be nil) edits a value before
// it is written.
func replaceMap[K comparable, V any](m *ebpf.Map, want map[K]V, adjust func(K, *V)) error {
	have, err := mapKeys[K, V](m)
	if err != nil {
		return fmt.Errorf("reading: %w", err)
	}
	for k, v := range want {
		if adjust != nil {
			adjust(k, &v)
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("adding: %w", err)
		}
	}
	for _, k := range have {
		if _, keep := want[k]; keep {
			continue
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing: %w", err)
		}
	}
	return nil
}

// Targets reads the shortcut's live destinations, sorted by VNI and MAC. A
// destination whose device left the devmap (the device is gone), whose
// deadline passed, or that a change counted since voided is left out: the
// programs no longer use it.
func (d Sync) Targets() ([]SyncTarget, error) {
	var k steerSyncKey
	var v steerSyncDest
	var out []SyncTarget
	changes, err := d.Changes()
	if err != nil {
		return nil, err
	}
	now := uint64(Now())
	it := d.objs.SteerSync.Iterate()
	for it.Next(&k, &v) {
		var dev uint32
		if v.Deadline <= now || v.Changes != changes || d.objs.SteerSyncDev.Lookup(v.Ifindex, &dev) != nil {
			continue
		}
		out = append(out, SyncTarget{VNI: k.Vni, MAC: net.HardwareAddr(append([]byte(nil), k.Mac[:]...)), Ifindex: v.Ifindex, MTU: v.Mtu})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading sync targets: %w", err)
	}
	sortSync(out)
	return out, nil
}

// SourceSeen is a sync source and when the shortcut last took one of its
// frames (CLOCK_MONOTONIC; 0: never).
type SourceSeen struct {
	SyncSource
	Seen time.Duration
}

// Get reads the whole set: the live destinations (Targets), the sources
// and the local addresses, sorted.
func (d Sync) Get() (SyncSet, error) {
	ts, err := d.Targets()
	if err != nil {
		return SyncSet{}, err
	}
	s := SyncSet{Targets: ts}
	srcs, err := d.Sources()
	if err != nil {
		return SyncSet{}, err
	}
	for _, src := range srcs {
		s.Sources = append(s.Sources, src.SyncSource)
	}
	var lk steerSyncLocalKey
	var lv steerSyncLocal
	it := d.objs.SteerSyncLocal.Iterate()
	for it.Next(&lk, &lv) {
		s.Locals = append(s.Locals, SyncLocal{Ifindex: lk.Ifindex, Addr: addrOf(lk.Addr), MAC: net.HardwareAddr(append([]byte(nil), lv.Mac[:]...))})
	}
	if err := it.Err(); err != nil {
		return SyncSet{}, fmt.Errorf("reading sync local addresses: %w", err)
	}
	s.sort()
	return s, nil
}

// Sources reads the sources with their seen stamps.
func (d Sync) Sources() ([]SourceSeen, error) {
	var k steerSyncKey
	var v steerSyncSrc
	var out []SourceSeen
	it := d.objs.SteerSyncSrc.Iterate()
	for it.Next(&k, &v) {
		out = append(out, SourceSeen{SyncSource{VNI: k.Vni, MAC: net.HardwareAddr(append([]byte(nil), k.Mac[:]...)), VTEP: addrOf(v.Vtep)}, time.Duration(v.Seen)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading sync sources: %w", err)
	}
	return out, nil
}

// FormatSync writes targets as the knob value's first part: the
// SyncTarget strings, sorted by VNI and MAC, comma-separated; "" for none.
func FormatSync(targets []SyncTarget) string {
	ts := slices.Clone(targets)
	sortSync(ts)
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ",")
}

// FormatSyncSet writes s as SyncKnob's value: FormatSync's targets, then,
// after ";", the sources and, after another ";", the local addresses,
// each sorted and comma-separated; "" for an empty set.
func FormatSyncSet(s SyncSet) string {
	if len(s.Sources) == 0 && len(s.Locals) == 0 {
		return FormatSync(s.Targets)
	}
	c := SyncSet{Targets: slices.Clone(s.Targets), Sources: slices.Clone(s.Sources), Locals: slices.Clone(s.Locals)}
	c.sort()
	src := make([]string, len(c.Sources))
	for i, x := range c.Sources {
		src[i] = x.String()
	}
	loc := make([]string, len(c.Locals))
	for i, x := range c.Locals {
		loc[i] = x.String()
	}
	return FormatSync(c.Targets) + ";" + strings.Join(src, ",") + ";" + strings.Join(loc, ",")
}

// ParseSync reads FormatSync's text.
func ParseSync(s string) ([]SyncTarget, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []SyncTarget
	for _, p := range strings.Split(s, ",") {
		bad := fmt.Errorf("sync target %q: want VNI/MAC>IFINDEX@MTU", p)
		vni, rest, ok1 := strings.Cut(p, "/")
		mac, rest, ok2 := strings.Cut(rest, ">")
		ifi, mtu, ok3 := strings.Cut(rest, "@")
		if !ok1 || !ok2 || !ok3 {
			return nil, bad
		}
		v, e1 := strconv.ParseUint(vni, 10, 32)
		hw, e2 := net.ParseMAC(mac)
		i, e3 := strconv.ParseUint(ifi, 10, 32)
		m, e4 := strconv.ParseUint(mtu, 10, 32)
		if err := errors.Join(e1, e2, e3, e4); err != nil {
			return nil, fmt.Errorf("%w: %w", bad, err)
		}
		t := SyncTarget{VNI: uint32(v), MAC: hw, Ifindex: uint32(i), MTU: uint32(m)}
		if err := t.check(); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// ParseSyncSet reads FormatSyncSet's text (a value of FormatSync's alone,
// as an earlier lanes journaled it, is targets only).
func ParseSyncSet(s string) (SyncSet, error) {
	parts := strings.Split(s, ";")
	if len(parts) != 1 && len(parts) != 3 {
		return SyncSet{}, fmt.Errorf("sync set %q: want TARGETS;SOURCES;LOCALS", s)
	}
	ts, err := ParseSync(parts[0])
	if err != nil {
		return SyncSet{}, err
	}
	out := SyncSet{Targets: ts}
	if len(parts) == 1 {
		return out, nil
	}
	for _, p := range splitList(parts[1]) {
		bad := fmt.Errorf("sync source %q: want VNI/MAC<VTEP", p)
		vni, rest, ok1 := strings.Cut(p, "/")
		mac, vtep, ok2 := strings.Cut(rest, "<")
		if !ok1 || !ok2 {
			return SyncSet{}, bad
		}
		v, e1 := strconv.ParseUint(vni, 10, 32)
		hw, e2 := net.ParseMAC(mac)
		a, e3 := netip.ParseAddr(vtep)
		if err := errors.Join(e1, e2, e3); err != nil {
			return SyncSet{}, fmt.Errorf("%w: %w", bad, err)
		}
		out.Sources = append(out.Sources, SyncSource{VNI: uint32(v), MAC: hw, VTEP: a})
	}
	for _, p := range splitList(parts[2]) {
		bad := fmt.Errorf("sync local address %q: want IFINDEX/ADDR=MAC", p)
		ifi, rest, ok1 := strings.Cut(p, "/")
		addr, mac, ok2 := strings.Cut(rest, "=")
		if !ok1 || !ok2 {
			return SyncSet{}, bad
		}
		i, e1 := strconv.ParseUint(ifi, 10, 32)
		a, e2 := netip.ParseAddr(addr)
		hw, e3 := net.ParseMAC(mac)
		if err := errors.Join(e1, e2, e3); err != nil {
			return SyncSet{}, fmt.Errorf("%w: %w", bad, err)
		}
		out.Locals = append(out.Locals, SyncLocal{Ifindex: uint32(i), Addr: a, MAC: hw})
	}
	return out, out.check()
}

func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// KindSync is SyncKnob's journal kind.
const KindSync = "steer-sync"

func init() { knobs.Register(KindSync, func() knobs.Knob { return &SyncKnob{} }) }

// SyncKnob is the shortcut's set in the datapath pinned in Dir, whose
// devices live in NetNS. Its value is FormatSyncSet's text; with the
// datapath gone there is nothing to restore (knobs.ErrGone). Written
// destinations hold for TTL (DefaultSyncTTL when 0), so a set written at
// apply closes by itself unless lanes agent renews it, and under change
// count 0, where a datapath's count starts (SyncSet.Changes). An agent changes
// the set after the apply; reset puts back what was there before the
// apply, normally nothing, and removing the datapath removes the rest.
type SyncKnob struct {
	Dir   string        `json:"dir"`
	NetNS string        `json:"netns"`
	TTL   time.Duration `json:"ttl,omitempty"`
}

// DefaultSyncTTL is how long destinations written without a lifetime hold.
const DefaultSyncTTL = 5 * time.Second

func (k *SyncKnob) Kind() string { return KindSync }
func (k *SyncKnob) Key() string  { return KindSync + ":" + k.Dir }

// open opens the sync maps alone (see openForRestore).
func (k *SyncKnob) open() (*Datapath, error) {
	return openForRestore(k.Dir, steerMapSteerSync, steerMapSteerSyncDev, steerMapSteerSyncSrc, steerMapSteerSyncLocal, steerMapSteerChanges)
}

func (k *SyncKnob) Read() ([]byte, error) {
	d, err := k.open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	s, err := d.Sync().Get()
	if err != nil {
		return nil, err
	}
	return []byte(FormatSyncSet(s)), nil
}

// Same says a set read is lanes' own whatever it holds: after the apply
// the set belongs to lanes agent, which rewrites it each round, and
// destinations past their deadline no longer read back (they lapsed, as
// meant). Neither is someone else's change for reset to report.
func (k *SyncKnob) Same(read, _ []byte) bool {
	_, err := ParseSyncSet(strings.TrimSpace(string(read)))
	return err == nil
}

func (k *SyncKnob) Write(v []byte) error {
	s, err := ParseSyncSet(string(v))
	if err != nil {
		return err
	}
	d, err := k.open()
	if err != nil {
		return err
	}
	defer d.Close()
	ttl := k.TTL
	if ttl <= 0 {
		ttl = DefaultSyncTTL
	}
	return netnsx.Do(k.NetNS, func() error { return d.Sync().Set(s, ttl) })
}
