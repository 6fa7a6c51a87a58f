package knobs

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/ethtool"
	"github.com/lanesnet/lanes/internal/netnsx"
)

const kindFeature = "ethtool-feature"

func init() { Register(kindFeature, func() Knob { return &DeviceFeature{} }) }

// DeviceFeature is one offload feature of a device ("on" or "off"), such as
// GRO on a veth, which also gives the veth a NAPI instance and with it the
// ability to take XDP-redirected frames (PRISM-sync's shortcut into a
// container).
type DeviceFeature struct {
	NetNS   string `json:"netns"`
	Device  string `json:"device"`
	Feature string `json:"feature"` // ethtool(8)'s name, e.g. generic-receive-offload
}

// Feature returns the knob of feature f of dev in ns.
func Feature(ns, dev string, f ethtool.Feature) *DeviceFeature {
	return &DeviceFeature{NetNS: ns, Device: dev, Feature: f.Name}
}

func (k *DeviceFeature) Kind() string { return kindFeature }
func (k *DeviceFeature) Key() string {
	return kindFeature + ":" + nsLabel(k.NetNS) + ":" + k.Device + ":" + k.Feature
}
func (k *DeviceFeature) String() string {
	return fmt.Sprintf("%s of %s/%s", k.Feature, nsLabel(k.NetNS), k.Device)
}

func (k *DeviceFeature) feature() (ethtool.Feature, error) {
	f, ok := ethtool.ByName(k.Feature)
	if !ok {
		return f, fmt.Errorf("%s: lanes does not know this feature", k)
	}
	return f, nil
}

func (k *DeviceFeature) Read() ([]byte, error) {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return nil, err
	}
	f, err := k.feature()
	if err != nil {
		return nil, err
	}
	on, err := ethtool.Get(ns, k.Device, f)
	if err != nil {
		return nil, deviceGone(err)
	}
	if on {
		return []byte("on"), nil
	}
	return []byte("off"), nil
}

func (k *DeviceFeature) Write(v []byte) error {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return err
	}
	f, err := k.feature()
	if err != nil {
		return err
	}
	var on bool
	switch string(v) {
	case "on":
		on = true
	case "off":
	default:
		return fmt.Errorf("%s: value %q, want on or off", k, v)
	}
	return deviceGone(ethtool.Set(ns, k.Device, f, on))
}

// deviceGone marks errors that mean the device or its namespace no longer
// exists.
func deviceGone(err error) error {
	if err != nil && (errors.Is(err, unix.ENODEV) || errors.Is(err, fs.ErrNotExist)) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// ethNS is the name internal/ethtool (through nsx) enters for namespace ns
// in any of its forms (a name, a path, "pid:N", "pid:N@C"), or ErrGone
// when it no longer exists (or is no longer the one C names).
func ethNS(ns string) (string, error) {
	return netnsx.EntryName(ns)
}
