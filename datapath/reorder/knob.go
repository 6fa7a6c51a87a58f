//go:build linux

package reorder

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/lanesnet/lanes/datapath/knobs"
)

// KindQdisc is the journal's kind of a reassembler knob.
const KindQdisc = "reorder-qdisc"

func init() { knobs.Register(KindQdisc, func() knobs.Knob { return &QdiscKnob{} }) }

// QdiscKnob is the reassembler at the root of Device in NetNS, loaded and
// pinned in Dir (inside the target's pin directory, whose own knob removes
// whatever a crash left there). Its value is "" when the device's root
// qdisc is not lanes' reassembler (the device's default, or whatever else
// is there: lanes never replaces a qdisc it did not set), otherwise the
// merge settings (EncodeConfig). Writing a config loads, pins and attaches
// the reassembler (or updates the settings of the one running); writing ""
// deletes lanes' root qdisc, which gives the device its default root
// back, and removes the pins, which unregisters the qdisc kind.
type QdiscKnob struct {
	NetNS  string `json:"netns,omitempty"`
	Device string `json:"device"`
	Dir    string `json:"dir"`
}

func (k *QdiscKnob) Kind() string { return KindQdisc }
func (k *QdiscKnob) Key() string  { return KindQdisc + ":" + label(k.NetNS) + ":" + k.Device }
func (k *QdiscKnob) String() string {
	return fmt.Sprintf("reassembling qdisc on %s in netns %s", k.Device, label(k.NetNS))
}

func (k *QdiscKnob) kind() string { return Kind(k.NetNS, k.Device) }

// configDoc spells a Config out for the journal.
type configDoc struct {
	Batch      uint32 `json:"batch"`
	Cores      int    `json:"cores"`
	TimeoutNS  int64  `json:"timeout_ns"`
	FlowLimit  uint32 `json:"flow_limit"`
	TotalLimit uint32 `json:"total_limit"`
	SelfCheck  bool   `json:"self_check,omitempty"`
}

// EncodeConfig is cfg as a QdiscKnob value.
func EncodeConfig(cfg Config) (string, error) {
	if err := cfg.Check(); err != nil {
		return "", err
	}
	b, err := json.Marshal(configDoc{Batch: cfg.Batch, Cores: cfg.Cores, TimeoutNS: int64(cfg.Timeout),
		FlowLimit: cfg.FlowLimit, TotalLimit: cfg.TotalLimit, SelfCheck: cfg.SelfCheck})
	return string(b), err
}

// DecodeConfig parses a QdiscKnob value.
func DecodeConfig(v string) (Config, error) {
	var d configDoc
	if err := json.Unmarshal([]byte(v), &d); err != nil {
		return Config{}, fmt.Errorf("reorder qdisc value: %w", err)
	}
	cfg := Config{Batch: d.Batch, Cores: d.Cores, Timeout: time.Duration(d.TimeoutNS), FlowLimit: d.FlowLimit, TotalLimit: d.TotalLimit,
		SelfCheck: d.SelfCheck}
	return cfg, cfg.Check()
}

func (k *QdiscKnob) Read() ([]byte, error) {
	r, err := RootQdisc(k.NetNS, k.Device)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", k, err)
	}
	if r.Kind != k.kind() || !Present(k.Dir) {
		return []byte{}, nil
	}
	p, err := Open(k.Dir)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	cfg, err := p.Config()
	if err != nil {
		return nil, err
	}
	v, err := EncodeConfig(cfg)
	return []byte(v), err
}

func (k *QdiscKnob) Write(v []byte) error {
	if len(v) == 0 {
		return k.remove()
	}
	cfg, err := DecodeConfig(string(v))
	if err != nil {
		return err
	}
	if err := k.load(cfg); err != nil {
		return fmt.Errorf("%s: %w", k, err)
	}
	return AttachRoot(k.NetNS, k.Device, k.kind())
}

// load makes Dir hold a reassembler running cfg: the one there if its
// window size fits cfg's batch (only the settings change), a new one
// otherwise.
func (k *QdiscKnob) load(cfg Config) error {
	if Present(k.Dir) {
		p, err := Open(k.Dir)
		if err != nil {
			return err
		}
		old, err := p.Config()
		if err == nil && windowSlots(old.Batch) == windowSlots(cfg.Batch) && old.SelfCheck == cfg.SelfCheck {
			err = p.SetConfig(cfg)
			p.Close()
			return err
		}
		p.Close()
		// The windows are sized, and the self-check compiled in or
		// out, at load: a new reassembler replaces the old one, whose
		// qdisc goes first.
		if err := DetachRoot(k.NetNS, k.Device, k.kind()); err != nil {
			return err
		}
	}
	// Whatever a crash left half-pinned goes first.
	if err := Unpin(k.Dir); err != nil {
		return err
	}
	l, err := Load(k.kind(), cfg)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := l.Pin(k.Dir); err != nil {
		Unpin(k.Dir)
		return err
	}
	return nil
}

// remove is Write(""): lanes' qdisc off the device, then the pins. A device
// that is gone has no qdisc left; its pins still go, and the gone error is
// returned so a restore counts the knob skipped.
func (k *QdiscKnob) remove() error {
	gone := DetachRoot(k.NetNS, k.Device, k.kind())
	if gone != nil && !errors.Is(gone, knobs.ErrGone) {
		return fmt.Errorf("removing %s: %w", k, gone)
	}
	if err := Unpin(k.Dir); err != nil {
		return err
	}
	return gone
}
