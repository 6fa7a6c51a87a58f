//go:build linux

package steer

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// VethFlow is a flow at PRISM's per-class container queues
// (Config.VethClass): the container-veth receive queue its frames take
// and how many of them the container side has not seen yet.
type VethFlow struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	// Queue is the receive queue of the container veth: 0 bulk, 1 high
	// priority. It changes with the flow's class once InFlight is 0 (or
	// after Config.Drain idle).
	Queue    int
	InFlight int64
	// LastSeen is the last frame's time on CLOCK_MONOTONIC.
	LastSeen time.Duration
}

// VethFlows lists the flows steer_tc_veth_class keeps.
func (d Prio) VethFlows() ([]VethFlow, error) {
	if d.objs.SteerVethClass == nil {
		return nil, errors.New("no per-class container queue map (datapath reopened from an older version?)")
	}
	var (
		k     steerSteerFlowKey
		v     steerVethClassState
		flows []VethFlow
	)
	it := d.objs.SteerVethClass.Iterate()
	for it.Next(&k, &v) {
		flows = append(flows, VethFlow{
			Src: beAddr(k.Saddr), Dst: beAddr(k.Daddr), SrcPort: bePort(k.Sport), DstPort: bePort(k.Dport), Proto: k.Proto,
			Queue: int(v.Queue), InFlight: v.Inflight, LastSeen: time.Duration(v.LastNs),
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the per-class container queues' flows: %w", err)
	}
	slices.SortFunc(flows, func(a, b VethFlow) int {
		return cmp.Or(a.Src.Compare(b.Src), a.Dst.Compare(b.Dst), cmp.Compare(a.SrcPort, b.SrcPort),
			cmp.Compare(a.DstPort, b.DstPort), cmp.Compare(a.Proto, b.Proto))
	})
	return flows, nil
}
