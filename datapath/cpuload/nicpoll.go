package cpuload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
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
	bits  []uint64 // nic_napi_bits as written, a word per entry
	wake  *nicWake // nil until the first ArmWake
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
	// The filter's bits after the ids: a new id's polls go uncounted only
	// until its bit is written, as before its id was; a dropped id's bit
	// cleared late costs lookups that miss, never a poll counted.
	words := n.objs.NicNapiBits.MaxEntries()
	if len(n.bits) != int(words) {
		n.bits = make([]uint64, words)
	}
	bits := make([]uint64, words)
	for _, id := range ids {
		bits[id/64%words] |= 1 << (id % 64)
	}
	for w := range bits {
		if bits[w] == n.bits[w] {
			continue
		}
		if err := n.objs.NicNapiBits.Put(uint32(w), bits[w]); err != nil {
			return true, fmt.Errorf("watching NAPI ids %d-%d: %w", w*64, w*64+63, err)
		}
		n.bits[w] = bits[w]
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
	if n.wake != nil {
		n.wake.close()
		n.wake = nil
	}
	if n.link != nil {
		n.link.Close()
		n.link = nil
	}
}

// Wake is one window of a core's NIC polls that found the armed depth
// (cpuacct.c, nic_wake): the core, and the polls and frames in the window.
type Wake struct {
	CPU           int
	Polls, Frames uint64
}

// nicWake reads the wake's ring buffer: the records of the arming in
// force (gen) go to ch, one waiting at most; those of an earlier arming,
// still in the ring when it was disarmed, are dropped.
type nicWake struct {
	rd   *ringbuf.Reader
	gen  uint32 // the arming in force, 0 none; read by run
	mu   sync.Mutex
	ch   chan Wake
	done chan struct{}
}

// wakeRecord is struct nic_wake_rec's size (gen, cpu, polls, frames).
const wakeRecord = 24

func (w *nicWake) run() {
	defer close(w.done)
	for {
		rec, err := w.rd.Read()
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil || len(rec.RawSample) < wakeRecord {
			continue
		}
		b := rec.RawSample
		gen := binary.NativeEndian.Uint32(b)
		wk := Wake{CPU: int(binary.NativeEndian.Uint32(b[4:])), Polls: binary.NativeEndian.Uint64(b[8:]), Frames: binary.NativeEndian.Uint64(b[16:])}
		// Under mu: an arming or disarming between the check and the
		// send would let an earlier arming's record past its drain.
		w.mu.Lock()
		if gen != 0 && gen == w.gen {
			select {
			case w.ch <- wk:
			default: // one is waiting already: it wakes the reader as well
			}
		}
		w.mu.Unlock()
	}
}

// next makes the arming after the one in force current (none while gen
// is 0 in the map: disarmed) and drops a wake of the one before.
func (w *nicWake) next() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	if w.gen == 0 {
		w.gen = 1
	}
	select {
	case <-w.ch:
	default:
	}
	return w.gen
}

func (w *nicWake) close() {
	w.rd.Close()
	<-w.done
}

// armWake arms the wake for core (-1: every core, each judged apart):
// windows of window, at least minPolls polls, depth frames a poll. An
// arming replaces the one before, and its windows start afresh.
func (n *nicPolls) armWake(core int, depth float64, window time.Duration, minPolls int) error {
	if !n.counting() {
		return errors.New("arming the NIC poll wake: no NIC's polls are counted")
	}
	if depth <= 0 || window <= 0 || minPolls < 1 || core < -1 {
		return fmt.Errorf("arming the NIC poll wake: depth %.2f, window %v, %d polls, core %d", depth, window, minPolls, core)
	}
	if n.wake == nil {
		rd, err := ringbuf.NewReader(n.objs.NicWakeRb)
		if err != nil {
			return fmt.Errorf("reading the NIC poll wake: %w", err)
		}
		n.wake = &nicWake{rd: rd, ch: make(chan Wake, 1), done: make(chan struct{})}
		go n.wake.run()
	}
	cpu := uint32(math.MaxUint32) // WAKE_ANY_CPU
	if core >= 0 {
		cpu = uint32(core)
	}
	// Current before the write, so that none of its records is dropped.
	// The program reads the entry's fields one by one while the write
	// copies them: a poll during it may judge one window by a mix of
	// the old and the new, a wake early at worst.
	gen := n.wake.next()
	cfg := cpuacctNicWake{WindowNs: uint64(window), Gen: gen, Depth: uint32(math.Round(depth * 100)), Cpu: cpu, MinPolls: uint32(minPolls)}
	if err := n.objs.NicWake.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("arming the NIC poll wake: %w", err)
	}
	return nil
}

// disarmWake disarms the wake; a wake already waiting is dropped.
func (n *nicPolls) disarmWake() error {
	if n.wake == nil {
		return nil
	}
	if err := n.objs.NicWake.Put(uint32(0), &cpuacctNicWake{}); err != nil {
		return fmt.Errorf("disarming the NIC poll wake: %w", err)
	}
	n.wake.next() // no arming's: the records still in the ring are dropped
	return nil
}

// wakes is where the armed wake's records arrive (nil before the first
// arming: never ready).
func (n *nicPolls) wakes() <-chan Wake {
	if n.wake == nil {
		return nil
	}
	return n.wake.ch
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
