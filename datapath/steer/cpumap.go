//go:build linux

package steer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/lanesnet/lanes/internal/kthread"
	"golang.org/x/sys/unix"
)

// CPUMap is one class of the split stage's queues: a cpumap whose entry
// for a core is that core's queue, with its own kthread. The bulk class
// (Datapath.CPUMap) takes every steered frame the priority rules do not
// mark; the high-priority class (HiCPUMap, Config.Prio) those they mark,
// so the control plane can run its kthreads at a higher real-time
// priority. Without an entry for a core, frames placed there are not
// redirected: they take the vanilla path on the core that received them.
type CPUMap struct {
	m    *ebpf.Map
	what string
}

func (d *Datapath) CPUMap() CPUMap   { return CPUMap{d.objs.SteerCpumap, "cpumap"} }
func (d *Datapath) HiCPUMap() CPUMap { return CPUMap{d.objs.SteerCpumapHi, "high-priority cpumap"} }

// Set gives cpu a queue of qsize frames. The kernel starts a
// cpumap/<cpu> kthread for it, which runs the split stage's share of the
// receive path.
func (c CPUMap) Set(cpu int, qsize uint32) error { return putCPUMap(c.m, c.what, cpu, qsize) }

// Del removes cpu's queue; frames placed there then stay on the core that
// received them. Removing a missing entry is not an error.
func (c CPUMap) Del(cpu int) error { return delCPUMap(c.m, c.what, cpu) }

// Entries lists the cores that have a queue, ascending.
func (c CPUMap) Entries() ([]int, error) { return cpuMapEntries(c.m, c.what) }

// Kthreads are the kthreads of the queues, one per core with an entry
// ("cpumap/<cpu>/map:<id>").
func (c CPUMap) Kthreads() ([]kthread.Info, error) { return cpuMapKthreads(c.m) }

func putCPUMap(m *ebpf.Map, what string, cpu int, qsize uint32) error {
	if cpu < 0 || cpu >= MaxCPUs {
		return fmt.Errorf("%s entry for core %d: must be 0..%d", what, cpu, MaxCPUs-1)
	}
	if qsize == 0 {
		// The kernel takes qsize 0 as a delete.
		return fmt.Errorf("%s entry for core %d: queue size 0", what, cpu)
	}
	if err := m.Put(uint32(cpu), steerBpfCpumapVal{Qsize: qsize}); err != nil {
		return fmt.Errorf("%s entry for core %d: %w", what, cpu, err)
	}
	return nil
}

func delCPUMap(m *ebpf.Map, what string, cpu int) error {
	if cpu < 0 || cpu >= MaxCPUs {
		return fmt.Errorf("%s entry for core %d: must be 0..%d", what, cpu, MaxCPUs-1)
	}
	if err := m.Delete(uint32(cpu)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("removing %s entry for core %d: %w", what, cpu, err)
	}
	return nil
}

func cpuMapEntries(m *ebpf.Map, what string) ([]int, error) {
	var cpus []int
	var v steerBpfCpumapVal
	for cpu := range MaxCPUs {
		err := m.Lookup(uint32(cpu), &v)
		switch {
		case err == nil:
			cpus = append(cpus, cpu)
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			return nil, fmt.Errorf("reading %s entry for core %d: %w", what, cpu, err)
		}
	}
	return cpus, nil
}

// setCPUMapSched gives the kthreads of a cpumap ("cpumap/<cpu>/map:<id>")
// the scheduling policy a.
func setCPUMapSched(m *ebpf.Map, a *unix.SchedAttr) error {
	ths, err := cpuMapKthreads(m)
	if err != nil {
		return err
	}
	a.Size = unix.SizeofSchedAttr
	for _, th := range ths {
		if err := unix.SchedSetAttr(th.PID, a, 0); err != nil {
			return fmt.Errorf("setting the scheduling policy of %s: %w", th.Comm, err)
		}
	}
	return nil
}

// cpuMapKthreads are the kthreads of a cpumap's entries.
func cpuMapKthreads(m *ebpf.Map) ([]kthread.Info, error) {
	info, err := m.Info()
	if err != nil {
		return nil, err
	}
	id, ok := info.ID()
	if !ok {
		return nil, fmt.Errorf("cpumap has no id on this kernel")
	}
	suffix := fmt.Sprintf("/map:%d", id)
	return kthread.List(func(c string) bool { return strings.HasPrefix(c, "cpumap/") && strings.HasSuffix(c, suffix) })
}
