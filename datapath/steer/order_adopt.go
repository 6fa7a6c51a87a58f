//go:build linux

package steer

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// Adopting containers after apply (bpf/maps.h, steer_adopt): while a
// container device's window is open, a flow whose container stage has no
// state yet starts where the kernel runs it (Stay), counted, and leaves
// for the table's core only through the move rule. The window covers the
// flows that already ran when the device's programs were attached: their
// earlier frames, uncounted, may still be queued on vanilla's core.

// SetAdopting opens (or extends) the adoption windows of the container
// stage's devices ifindexes (host-side veths) until d from now, and drops
// windows that have closed (once per call: the map is walked once
// however many devices a round adopts).
func (dp Order) SetAdopting(d time.Duration, ifindexes ...int) error {
	for _, idx := range ifindexes {
		if idx <= 0 {
			return fmt.Errorf("adopting ifindex %d: not a device", idx)
		}
	}
	if err := dp.expireAdopting(); err != nil {
		return err
	}
	until := uint64(Now() + d)
	for _, idx := range ifindexes {
		if err := dp.objs.SteerAdopt.Put(uint32(idx), until); err != nil {
			return fmt.Errorf("opening the adoption window of ifindex %d: %w", idx, err)
		}
	}
	return nil
}

// Adopting lists the devices whose adoption window is open, with the time
// left.
func (dp Order) Adopting() (map[int]time.Duration, error) {
	out := map[int]time.Duration{}
	now := uint64(Now())
	var k uint32
	var until uint64
	it := dp.objs.SteerAdopt.Iterate()
	for it.Next(&k, &until) {
		if until > now {
			out[int(k)] = time.Duration(until - now)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading adoption windows: %w", err)
	}
	return out, nil
}

// expireAdopting deletes the closed windows (the map holds 4096).
func (dp *core) expireAdopting() error {
	now := uint64(Now())
	var k uint32
	var until uint64
	var old []uint32
	it := dp.objs.SteerAdopt.Iterate()
	for it.Next(&k, &until) {
		if until <= now {
			old = append(old, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading adoption windows: %w", err)
	}
	for _, k := range old {
		if err := dp.objs.SteerAdopt.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("closing the adoption window of ifindex %d: %w", k, err)
		}
	}
	return nil
}

// OpenAdopt reopens only the adoption windows of the datapath pinned in
// dir (control/follow.go).
func OpenAdopt(dir string) (*Datapath, error) {
	d, _, err := openMaps(dir, []string{steerMapSteerAdopt})
	return d, err
}
