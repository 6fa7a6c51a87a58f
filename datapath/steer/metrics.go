package steer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a pinned datapath's counters at every scrape, for the
// agents' metrics endpoint: lanes_steer_packets_total{stage, outcome}, and
// with a quiet time (Config.PrioQuiet) lanes_prism_high_quiet (1 while
// bulk skips its queue for lack of high-priority frames) and
// lanes_prism_since_high_seconds; and lanes_steer_queue_frames_total{core,
// event}, each core's split-stage queues' frames in, out and dropped; with
// priority classes lanes_prism_high_inline (the number of rules whose
// flows high=auto runs in the NIC poll), with bulk-quiet
// lanes_prism_bulk_quiet, and with bulk=auto lanes_prism_bulk_beside_busy.
// Reading at scrape time keeps the
// counters' own source of truth: the datapath's per-CPU maps.
type Collector struct {
	dir                                                       string
	frames, quiet, last, queue, inline, bulkQuiet, besideBusy *prometheus.Desc
}

// NewCollector collects from the datapath pinned in dir.
func NewCollector(dir string) *Collector {
	return &Collector{
		dir: dir,
		frames: prometheus.NewDesc("lanes_steer_packets_total",
			"Packets seen by the steering programs (and flow moves), by stage and outcome.", []string{"stage", "outcome"}, nil),
		quiet: prometheus.NewDesc("lanes_prism_high_quiet",
			"1 while no high-priority frame came for the quiet time (prism quiet=): bulk runs in the NIC poll.", nil, nil),
		last: prometheus.NewDesc("lanes_prism_since_high_seconds",
			"Time since the last high-priority frame (prism quiet=; absent before the first).", nil, nil),
		inline: prometheus.NewDesc("lanes_prism_high_inline",
			"Priority rules whose flows run their first stage in the NIC poll now (prism high=auto, switched rule by rule by lanes agent); 0 while every rule's flows take the high-priority queue.", nil, nil),
		bulkQuiet: prometheus.NewDesc("lanes_prism_bulk_quiet",
			"1 while no bulk frame came for the bulk quiet time (prism bulk-quiet, with high=auto): every high-priority flow runs in the NIC poll.", nil, nil),
		besideBusy: prometheus.NewDesc("lanes_prism_bulk_beside_busy",
			"1 while bulk runs in the NIC poll because every high-priority frame of the window ran there as a busy rule's (prism bulk=auto).", nil, nil),
		queue: prometheus.NewDesc("lanes_steer_queue_frames_total",
			"Frames through each core's split-stage queues (cpumap, both classes): enqueued, seen (out), dropped_ring (the ring was full), dropped_kthread (no skb), lost (booked by lanes agent).",
			[]string{"core", "event"}, nil),
	}
}

// counterEvents name the Counters fields exported, as outcome labels.
var counterEvents = []struct {
	name string
	get  func(*Counters) uint64
}{
	{"steered", func(c *Counters) uint64 { return c.Steered }},
	{"stayed", func(c *Counters) uint64 { return c.Stayed }},
	{"passed", func(c *Counters) uint64 { return c.Passed }},
	{"held", func(c *Counters) uint64 { return c.Held }},
	{"moved", func(c *Counters) uint64 { return c.Moved }},
	{"undrained", func(c *Counters) uint64 { return c.Undrained }},
	{"settled", func(c *Counters) uint64 { return c.Settled }},
	{"dropped", func(c *Counters) uint64 { return c.Dropped }},
	{"disabled", func(c *Counters) uint64 { return c.Disabled }},
	{"high", func(c *Counters) uint64 { return c.High }},
	{"sync", func(c *Counters) uint64 { return c.Sync }},
	{"sync_miss", func(c *Counters) uint64 { return c.SyncMiss }},
	{"sync_refused", func(c *Counters) uint64 { return c.SyncRefused }},
	{"sync_expired", func(c *Counters) uint64 { return c.SyncExpired }},
	{"sync_dropped", func(c *Counters) uint64 { return c.SyncDropped }},
	{"home", func(c *Counters) uint64 { return c.Home }},
	{"direct", func(c *Counters) uint64 { return c.Direct }},
	{"bulk_beside", func(c *Counters) uint64 { return c.BulkBeside }},
	{"aside", func(c *Counters) uint64 { return c.Aside }},
	{"unmarked", func(c *Counters) uint64 { return c.Unmarked }},
	{"remade", func(c *Counters) uint64 { return c.Remade }},
	{"micro_frames", func(c *Counters) uint64 { return c.MicroFrames }},
	{"micro_late", func(c *Counters) uint64 { return c.MicroLate }},
	{"fast", func(c *Counters) uint64 { return c.Fast }},
	{"fast_no_entry", func(c *Counters) uint64 { return c.FastNoEntry }},
	{"fast_other", func(c *Counters) uint64 { return c.FastOther }},
	{"fast_refused", func(c *Counters) uint64 { return c.FastRefused }},
	{"fast_gso", func(c *Counters) uint64 { return c.FastGSO }},
	{"fast_stale", func(c *Counters) uint64 { return c.FastStale }},
	{"fast_lease", func(c *Counters) uint64 { return c.FastLease }},
	{"fast_idle", func(c *Counters) uint64 { return c.FastIdle }},
	{"fast_ended", func(c *Counters) uint64 { return c.FastEnded }},
	{"fast_dropped", func(c *Counters) uint64 { return c.FastDropped }},
	{"fast_admitted", func(c *Counters) uint64 { return c.FastAdmitted }},
	{"fast_unlearned", func(c *Counters) uint64 { return c.FastUnlearned }},
	{"fast_behind", func(c *Counters) uint64 { return c.FastBehind }},
	{"fastout", func(c *Counters) uint64 { return c.FastOut }},
	{"fastout_no_entry", func(c *Counters) uint64 { return c.FastOutNoEntry }},
	{"fastout_other", func(c *Counters) uint64 { return c.FastOutOther }},
	{"fastout_refused", func(c *Counters) uint64 { return c.FastOutRefused }},
	{"fastout_stale", func(c *Counters) uint64 { return c.FastOutStale }},
	{"fastout_lease", func(c *Counters) uint64 { return c.FastOutLease }},
	{"fastout_idle", func(c *Counters) uint64 { return c.FastOutIdle }},
	{"fastout_ended", func(c *Counters) uint64 { return c.FastOutEnded }},
	{"fastout_dropped", func(c *Counters) uint64 { return c.FastOutDropped }},
	{"fastout_admitted", func(c *Counters) uint64 { return c.FastOutAdmitted }},
	{"fastout_unlearned", func(c *Counters) uint64 { return c.FastOutUnlearned }},
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.frames
	ch <- c.quiet
	ch <- c.last
	ch <- c.queue
	ch <- c.inline
	ch <- c.bulkQuiet
	ch <- c.besideBusy
}

// Collect reads the datapath; a datapath that is gone or unreadable
// yields no samples (the scrape itself does not fail).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	// Only what is read, so that pins of another version (without the
	// quiet stamp, say) still give their counters.
	d, _, err := openMaps(c.dir, []string{steerMapSteerCfg, steerMapSteerStats})
	if err != nil {
		return
	}
	defer d.Close()
	if st, err := d.Stats(); err == nil {
		for stage := range st {
			for _, e := range counterEvents {
				ch <- prometheus.MustNewConstMetric(c.frames, prometheus.CounterValue, float64(e.get(&st[stage])), StageName(stage), e.name)
			}
		}
	}
	c.collectQueues(ch)
	cfg, err := d.configOnly()
	if err != nil || !cfg.Prio {
		return
	}
	if hi, _, err := openMaps(c.dir, []string{steerMapSteerHighInline}); err == nil {
		if on, err := hi.highSwitches(); err == nil {
			n := len(on)
			if cfg.HighAutoPPS == 0 {
				n = 0 // the programs ignore the switches
			}
			ch <- prometheus.MustNewConstMetric(c.inline, prometheus.GaugeValue, float64(n))
		}
		hi.Close()
	}
	if cfg.BulkQuiet != 0 && cfg.HighAutoPPS != 0 {
		if bs, _, err := openMaps(c.dir, []string{steerMapSteerBulkSeen}); err == nil {
			if quiet, _, _, err := bs.Prio().BulkQuiet(cfg.BulkQuiet); err == nil {
				ch <- prometheus.MustNewConstMetric(c.bulkQuiet, prometheus.GaugeValue, b2f(quiet))
			}
			bs.Close()
		}
	}
	if cfg.BulkAuto != 0 && cfg.HighAutoPPS != 0 {
		if bs, _, err := openMaps(c.dir, []string{steerMapSteerHighSeen}); err == nil {
			if on, err := bs.Prio().BulkBesideBusy(cfg.BulkAuto); err == nil {
				ch <- prometheus.MustNewConstMetric(c.besideBusy, prometheus.GaugeValue, b2f(on))
			}
			bs.Close()
		}
	}
	if cfg.PrioQuiet == 0 {
		return
	}
	seen, _, err := openMaps(c.dir, []string{steerMapSteerPrioSeen})
	if err != nil {
		return
	}
	defer seen.Close()
	quiet, since, ok, err := seen.Prio().HighQuiet(cfg.PrioQuiet)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(c.quiet, prometheus.GaugeValue, b2f(quiet))
	if ok {
		ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, since.Seconds())
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c *Collector) collectQueues(ch chan<- prometheus.Metric) {
	d, _, err := openMaps(c.dir, []string{steerMapSteerQueues, steerMapSteerQmaps, steerMapSteerQueueLost})
	if err != nil {
		return
	}
	defer d.Close()
	qs, _, err := d.Order().Queues()
	if err != nil {
		return
	}
	for _, q := range qs {
		core := strconv.Itoa(q.Core)
		for _, e := range []struct {
			name string
			v    uint64
		}{{"enqueued", q.Enqueued}, {"seen", q.Seen}, {"dropped_ring", q.DroppedRing}, {"dropped_kthread", q.DroppedKthread}, {"lost", q.Lost}} {
			ch <- prometheus.MustNewConstMetric(c.queue, prometheus.CounterValue, float64(e.v), core, e.name)
		}
	}
}
