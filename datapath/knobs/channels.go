package knobs

import (
	"fmt"

	"github.com/lanesnet/lanes/internal/ethtool"
)

const kindChannels = "ethtool-channels"

func init() { Register(kindChannels, func() Knob { return &DeviceChannels{} }) }

// DeviceChannels is the number of receive and transmit queues a device
// uses ("rx=2 tx=1"), as ethtool -L sets them. A veth is made with a queue
// per possible CPU unless its creator says otherwise and uses one of each;
// PRISM's per-class queues (policy/prism, veth-queues=class) turn on a
// second.
type DeviceChannels struct {
	NetNS  string `json:"netns"`
	Device string `json:"device"`
}

// Channels returns the queue-count knob of dev in ns.
func Channels(ns, dev string) *DeviceChannels { return &DeviceChannels{NetNS: ns, Device: dev} }

func (k *DeviceChannels) Kind() string { return kindChannels }
func (k *DeviceChannels) Key() string {
	return kindChannels + ":" + nsLabel(k.NetNS) + ":" + k.Device
}
func (k *DeviceChannels) String() string {
	return fmt.Sprintf("queues of %s/%s", nsLabel(k.NetNS), k.Device)
}

// FormatChannels renders a knob value.
func FormatChannels(rx, tx int) string { return fmt.Sprintf("rx=%d tx=%d", rx, tx) }

func (k *DeviceChannels) Read() ([]byte, error) {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return nil, err
	}
	c, err := ethtool.GetChannels(ns, k.Device)
	if err != nil {
		return nil, deviceGone(err)
	}
	return []byte(FormatChannels(int(c.RX), int(c.TX))), nil
}

func (k *DeviceChannels) Write(v []byte) error {
	ns, err := ethNS(k.NetNS)
	if err != nil {
		return err
	}
	var rx, tx uint32
	if n, err := fmt.Sscanf(string(v), "rx=%d tx=%d", &rx, &tx); err != nil || n != 2 || rx == 0 || tx == 0 {
		return fmt.Errorf("%s: value %q, want rx=N tx=M (N, M >= 1)", k, v)
	}
	return deviceGone(ethtool.SetRXTX(ns, k.Device, rx, tx))
}
