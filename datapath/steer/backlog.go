//go:build linux

package steer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
)

// BacklogEvery is how often the agent samples the per-CPU backlogs.
const BacklogEvery = 5 * time.Millisecond

// BacklogSampler tells the datapath when each core's RPS backlog was last
// seen empty (steer.c, struct backlog_seen): a flow whose later-stage
// frames went into a backlog that was read empty afterwards left it, so it
// moves without the drain time, and one whose backlog was never read empty
// since does not move on the drain time alone. The lengths come from
// /proc/net/softnet_stat (the backlog column, Linux >= 5.10), global to
// the host.
type BacklogSampler struct {
	dir      string
	m, table *ebpf.Map
	empty    map[uint32]uint64 // core -> last time read empty
}

// OpenBacklogs opens the backlog map of the datapath pinned in dir.
func OpenBacklogs(dir string) (*BacklogSampler, error) {
	s := &BacklogSampler{dir: dir, empty: map[uint32]uint64{}}
	return s, s.reopen()
}

// reopen opens the pinned maps again: lanes apply may have replaced the
// datapath since.
func (s *BacklogSampler) reopen() error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(s.dir, steerMapSteerBacklog), nil)
	if err != nil {
		return fmt.Errorf("opening the backlog map in %s (a datapath of an older lanes?): %w", s.dir, err)
	}
	table, err := ebpf.LoadPinnedMap(filepath.Join(s.dir, steerMapSteerTable), nil)
	if err != nil {
		m.Close()
		return fmt.Errorf("opening the placement table in %s: %w", s.dir, err)
	}
	s.Close()
	s.m, s.table = m, table
	return nil
}

// Close releases the maps.
func (s *BacklogSampler) Close() error {
	var errs []error
	for _, m := range []*ebpf.Map{s.m, s.table} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	s.m, s.table = nil, nil
	return errors.Join(errs...)
}

// laterStagesSteered reports whether any bucket of the bridge or container
// stage names a core: only then do flows wait on RPS backlogs.
func (s *BacklogSampler) laterStagesSteered() (bool, error) {
	for k := uint32(StageBridge * Buckets); k < NumStages*Buckets; k++ {
		var v uint32
		if err := s.table.Lookup(k, &v); err != nil {
			return false, fmt.Errorf("reading the placement table: %w", err)
		}
		if v != Stay {
			return true, nil
		}
	}
	return false, nil
}

// Sample reads every core's backlog length once and writes what it saw.
func (s *BacklogSampler) Sample() error {
	at := uint64(Now()) // before the read: a zero read proves what went in before it
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return err
	}
	lens, err := parseBacklogs(b)
	if err != nil {
		return err
	}
	for core, n := range lens {
		if core >= MaxCPUs {
			continue
		}
		if n == 0 {
			s.empty[core] = at
		}
		v := steerBacklogSeen{SampledNs: at, EmptyNs: s.empty[core]}
		if err := s.m.Update(core, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing core %d's backlog: %w", core, err)
		}
	}
	return nil
}

// Run samples every BacklogEvery, while some later stage is steered
// (checked every second: the balancer changes the tables), until ctx ends;
// the first error ends it too (and is returned). Idle, it leaves the
// samples to age: the datapath then falls back to the drain time.
func (s *BacklogSampler) Run(ctx context.Context) error {
	t := time.NewTicker(BacklogEvery)
	defer t.Stop()
	const checkEvery = int(time.Second / BacklogEvery)
	active := false
	for i := 0; ; i++ {
		if i%checkEvery == 0 {
			var err error
			if err = s.reopen(); err != nil {
				return err
			}
			if active, err = s.laterStagesSteered(); err != nil {
				return err
			}
		}
		if active {
			if err := s.Sample(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// parseBacklogs reads each online core's backlog length from
// /proc/net/softnet_stat: one line per core, hexadecimal columns, the
// backlog length 12th and the core 13th.
func parseBacklogs(b []byte) (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 {
			continue
		}
		if len(f) < 13 {
			return nil, errors.New("/proc/net/softnet_stat has no backlog length column (needs Linux >= 5.10)")
		}
		n, err1 := strconv.ParseUint(string(f[11]), 16, 64)
		core, err2 := strconv.ParseUint(string(f[12]), 16, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("/proc/net/softnet_stat: bad line %q", sc.Text())
		}
		out[uint32(core)] = n
	}
	return out, sc.Err()
}
