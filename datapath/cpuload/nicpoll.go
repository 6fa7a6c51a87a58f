package cpuload

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// NICCount is what a NIC's polls on one core did over an interval: the
// polls that found frames, and the frames they took (cpuacct.c,
// acct_poll).
type NICCount struct {
	Polls, Frames uint64
}

// FramesPerPoll is how many frames the polls found waiting, on average
// (0 with no frames polled).
func (n NICCount) FramesPerPoll() float64 {
	if n.Polls == 0 {
		return 0
	}
	return float64(n.Frames) / float64(n.Polls)
}

// since is n less an earlier reading (0 where a counter went back).
func (n NICCount) since(a NICCount) NICCount {
	d := func(x, y uint64) uint64 {
		if y < x {
			return 0
		}
		return y - x
	}
	return NICCount{Polls: d(a.Polls, n.Polls), Frames: d(a.Frames, n.Frames)}
}

// nicPolls is the poll counter of a loaded cpuacct object: the NAPI ids
// it counts (nic_napis) and the tracing program, attached on the first
// id. SchedSampler and NICCounter each hold one.
type nicPolls struct {
	objs  *cpuacctObjects
	link  link.Link
	napis []uint32
}

// watch makes ids (deduplicated) the counted set; changed says whether
// it differs from the one before.
func (n *nicPolls) watch(ids []uint32) (changed bool, err error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if slices.Equal(ids, n.napis) && (n.link != nil || len(ids) == 0) {
		return false, nil
	}
	if max := int(n.objs.NicNapis.MaxEntries()); len(ids) > max {
		return false, fmt.Errorf("watching %d NAPI instances: at most %d", len(ids), max)
	}
	if n.link == nil && len(ids) > 0 {
		l, err := link.AttachTracing(link.TracingOptions{Program: n.objs.AcctPoll})
		if err != nil {
			return false, fmt.Errorf("attaching the NIC poll counter (tp_btf/napi_poll): %w", err)
		}
		n.link = l
	}
	for _, id := range n.napis {
		if !slices.Contains(ids, id) {
			if err := n.objs.NicNapis.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return true, fmt.Errorf("unwatching NAPI %d: %w", id, err)
			}
		}
	}
	n.napis = nil
	for _, id := range ids {
		if err := n.objs.NicNapis.Put(id, uint8(1)); err != nil {
			return true, fmt.Errorf("watching NAPI %d: %w", id, err)
		}
		n.napis = append(n.napis, id)
	}
	return true, nil
}

// counting: some NAPI instance is counted.
func (n *nicPolls) counting() bool { return n.link != nil && len(n.napis) > 0 }

// read returns each core's counts since the program was attached, by CPU
// number (nil when not attached).
func (n *nicPolls) read() ([]NICCount, error) {
	if n.link == nil {
		return nil, nil
	}
	var vals []cpuacctNicPoll
	if err := n.objs.NicPolls.Lookup(uint32(0), &vals); err != nil {
		return nil, fmt.Errorf("reading the NIC poll counts: %w", err)
	}
	out := make([]NICCount, len(vals))
	for i, v := range vals {
		out[i] = NICCount{Polls: v.Polls, Frames: v.Frames}
	}
	return out, nil
}

func (n *nicPolls) close() {
	if n.link != nil {
		n.link.Close()
		n.link = nil
	}
}

// NICCounter counts the polls of a NIC's NAPI instances per core and
// nothing else: none of SchedSampler's scheduler accounting runs beside
// it (for a benchmark that must not add tracing on every task switch).
// Close detaches it; nothing is pinned.
type NICCounter struct {
	objs cpuacctObjects
	n    nicPolls
}

// NewNICCounter loads the counter and starts counting the NAPI instances
// with these ids.
func NewNICCounter(ids []uint32) (*NICCounter, error) {
	if len(ids) == 0 {
		return nil, errors.New("counting NIC polls: no NAPI instance given")
	}
	c := &NICCounter{}
	if err := loadCpuacctObjects(&c.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the NIC poll counter: %w", err)
	}
	c.n.objs = &c.objs
	if _, err := c.n.watch(ids); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Read returns each core's counts so far, by CPU number.
func (c *NICCounter) Read() ([]NICCount, error) { return c.n.read() }

// Since is core cpu's counts between two Reads (zero where either lacks
// it).
func Since(a, b []NICCount, cpu int) NICCount {
	if cpu < 0 || cpu >= len(a) || cpu >= len(b) {
		return NICCount{}
	}
	return b[cpu].since(a[cpu])
}

// Close detaches the counter and frees its maps.
func (c *NICCounter) Close() error {
	c.n.close()
	return c.objs.Close()
}
