//go:build linux

package steer

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// SyncTarget is one destination of PRISM-sync's shortcut: high-priority
// frames of overlay VNI whose inner destination is MAC are decapsulated in
// XDP and redirected to the host-side veth Ifindex, when their inner frame
// (Ethernet header excluded) is no longer than MTU. Which destinations are
// safe is policy's business (policy/prism); see steer.c's sync_dest.
type SyncTarget struct {
	VNI     uint32
	MAC     net.HardwareAddr
	Ifindex uint32
	MTU     uint32
}

// maxSync is steer_sync's size.
const maxSync = 4096

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

func (s SyncTarget) key() steerSyncKey {
	k := steerSyncKey{Vni: s.VNI}
	copy(k.Mac[:], s.MAC)
	return k
}

func sortSync(ts []SyncTarget) {
	slices.SortFunc(ts, func(a, b SyncTarget) int {
		return cmp.Or(cmp.Compare(a.VNI, b.VNI), bytes.Compare(a.MAC, b.MAC))
	})
}

// SetSync makes targets the shortcut's destinations, replacing the previous
// ones. It must run in the network namespace of the targets' devices: the
// devmap resolves an ifindex in the namespace of whoever writes it. New
// devices go into the devmap before any destination names them, and stale
// ones leave it only after no destination does, so a frame never finds a
// destination whose device the redirect cannot reach.
func (d *Datapath) SetSync(targets []SyncTarget) error {
	if len(targets) > maxSync {
		return fmt.Errorf("%d sync targets, at most %d", len(targets), maxSync)
	}
	want := map[steerSyncKey]steerSyncDest{}
	devs := map[uint32]bool{}
	for _, t := range targets {
		if err := t.check(); err != nil {
			return err
		}
		k := t.key()
		if _, dup := want[k]; dup {
			return fmt.Errorf("sync target %s listed twice", t)
		}
		want[k] = steerSyncDest{Ifindex: t.Ifindex, Mtu: t.MTU}
		devs[t.Ifindex] = true
	}
	for ifi := range devs {
		if err := d.objs.SteerSyncDev.Put(ifi, ifi); err != nil {
			return fmt.Errorf("adding device %d to the sync devmap (is it in this namespace?): %w", ifi, err)
		}
	}
	have, err := d.syncEntries()
	if err != nil {
		return err
	}
	for k, v := range want {
		if err := d.objs.SteerSync.Put(k, v); err != nil {
			return fmt.Errorf("adding sync target: %w", err)
		}
	}
	for k := range have {
		if _, keep := want[k]; keep {
			continue
		}
		if err := d.objs.SteerSync.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("removing sync target: %w", err)
		}
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

func (d *Datapath) syncEntries() (map[steerSyncKey]steerSyncDest, error) {
	out := map[steerSyncKey]steerSyncDest{}
	var k steerSyncKey
	var v steerSyncDest
	it := d.objs.SteerSync.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading sync targets: %w", err)
	}
	return out, nil
}

// Sync reads the shortcut's destinations, sorted by VNI and MAC. A
// destination whose device left the devmap (the device is gone) is left
// out: the programs no longer use it.
func (d *Datapath) Sync() ([]SyncTarget, error) {
	m, err := d.syncEntries()
	if err != nil {
		return nil, err
	}
	var out []SyncTarget
	for k, v := range m {
		var dev uint32
		if err := d.objs.SteerSyncDev.Lookup(v.Ifindex, &dev); err != nil {
			continue
		}
		out = append(out, SyncTarget{VNI: k.Vni, MAC: net.HardwareAddr(append([]byte(nil), k.Mac[:]...)), Ifindex: v.Ifindex, MTU: v.Mtu})
	}
	sortSync(out)
	return out, nil
}

// FormatSync writes targets as SyncKnob's value: the SyncTarget strings,
// sorted by VNI and MAC, comma-separated; "" for none.
func FormatSync(targets []SyncTarget) string {
	ts := slices.Clone(targets)
	sortSync(ts)
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.String()
	}
	return strings.Join(parts, ",")
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

// KindSync is SyncKnob's journal kind.
const KindSync = "steer-sync"

func init() { knobs.Register(KindSync, func() knobs.Knob { return &SyncKnob{} }) }

// SyncKnob is the shortcut's destinations in the datapath pinned in Dir,
// whose devices live in NetNS. Its value is FormatSync's text; with the
// datapath gone there is nothing to restore (knobs.ErrGone). An agent
// (lanes agent) may change the set after the apply; reset puts back what
// was there before the apply, normally nothing, and removing the datapath
// removes the rest.
type SyncKnob struct {
	Dir   string `json:"dir"`
	NetNS string `json:"netns"`
}

func (k *SyncKnob) Kind() string { return KindSync }
func (k *SyncKnob) Key() string  { return KindSync + ":" + k.Dir }

// open opens the sync maps alone (see openForRestore).
func (k *SyncKnob) open() (*Datapath, error) {
	return openForRestore(k.Dir, steerMapSteerSync, steerMapSteerSyncDev)
}

func (k *SyncKnob) Read() ([]byte, error) {
	d, err := k.open()
	if err != nil {
		return nil, err
	}
	defer d.Close()
	ts, err := d.Sync()
	if err != nil {
		return nil, err
	}
	return []byte(FormatSync(ts)), nil
}

func (k *SyncKnob) Write(v []byte) error {
	ts, err := ParseSync(string(v))
	if err != nil {
		return err
	}
	d, err := k.open()
	if err != nil {
		return err
	}
	defer d.Close()
	return knobs.Do(k.NetNS, func() error { return d.SetSync(ts) })
}
