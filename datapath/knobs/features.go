package knobs

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lanesnet/lanes/internal/ethtool"
)

const kindFeatures = "ethtool-features"

func init() { Register(kindFeatures, func() Knob { return &DeviceFeatures{} }) }

// TSOFeatures are the features a veth's TSO consists of (the kernel's
// NETIF_F_ALL_TSO), in the order they can be turned on: ECN needs another
// of them on, mangleid needs the first.
var TSOFeatures = []string{"tx-tcp-segmentation", "tx-tcp6-segmentation", "tx-tcp-ecn-segmentation", "tx-tcp-mangleid-segmentation"}

// DeviceFeatures is a set of named features of a device, each on or off
// ("tx-tcp-segmentation=off tx-tcp6-segmentation=on ..."), so that a
// restore puts each back as it was; the legacy one-feature commands
// (DeviceFeature) switch a whole group, such as every kind of TSO, at once.
type DeviceFeatures struct {
	NetNS  string   `json:"netns"`
	Device string   `json:"device"`
	Names  []string `json:"names"` // ethtool -k's names, in turn-on order
}

// Features returns the knob of the named features of dev in ns.
func Features(ns, dev string, names ...string) *DeviceFeatures {
	return &DeviceFeatures{NetNS: ns, Device: dev, Names: names}
}

func (k *DeviceFeatures) Kind() string { return kindFeatures }
func (k *DeviceFeatures) Key() string {
	return kindFeatures + ":" + nsLabel(k.NetNS) + ":" + k.Device + ":" + strings.Join(k.Names, ",")
}
func (k *DeviceFeatures) String() string {
	return fmt.Sprintf("%s of %s/%s", strings.Join(k.Names, ", "), nsLabel(k.NetNS), k.Device)
}

// FormatAll renders a value of k with every feature on or off.
func (k *DeviceFeatures) FormatAll(on bool) string {
	state := map[bool]string{true: "on", false: "off"}[on]
	var f []string
	for _, n := range k.Names {
		f = append(f, n+"="+state)
	}
	return strings.Join(f, " ")
}

func (k *DeviceFeatures) Read() ([]byte, error) {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return nil, err
	}
	got, err := ethtool.GetNamed(ns, k.Device, k.Names...)
	if err != nil {
		return nil, deviceGone(err)
	}
	var f []string
	for _, n := range k.Names {
		f = append(f, fmt.Sprintf("%s=%s", n, map[bool]string{true: "on", false: "off"}[got[n]]))
	}
	return []byte(strings.Join(f, " ")), nil
}

// Write turns on what v turns on, in Names' order, then off what it turns
// off, in reverse order: a feature that needs another is never turned on
// without it.
func (k *DeviceFeatures) Write(v []byte) error {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, f := range strings.Fields(string(v)) {
		name, state, ok := strings.Cut(f, "=")
		if !ok || (state != "on" && state != "off") || !slices.Contains(k.Names, name) {
			return fmt.Errorf("%s: bad value %q: want NAME=on|off for each of %s", k, v, strings.Join(k.Names, ", "))
		}
		want[name] = state == "on"
	}
	if len(want) != len(k.Names) {
		return fmt.Errorf("%s: value %q does not give every feature", k, v)
	}
	// A feature already as wanted is not written: writing sets the
	// device's requested bit, and a feature the kernel holds off because
	// another is off (mangleid without TSO) would lose its request.
	got, err := ethtool.GetNamed(ns, k.Device, k.Names...)
	if err != nil {
		return deviceGone(err)
	}
	for _, n := range k.Names {
		if want[n] && !got[n] {
			if err := ethtool.SetNamed(ns, k.Device, n, true); err != nil {
				return deviceGone(err)
			}
		}
	}
	if got, err = ethtool.GetNamed(ns, k.Device, k.Names...); err != nil {
		return deviceGone(err)
	}
	for i := len(k.Names) - 1; i >= 0; i-- {
		if n := k.Names[i]; !want[n] && got[n] {
			if err := ethtool.SetNamed(ns, k.Device, n, false); err != nil {
				return deviceGone(err)
			}
		}
	}
	return nil
}
