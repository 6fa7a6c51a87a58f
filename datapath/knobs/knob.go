// Package knobs changes kernel settings so that every change can be undone,
// even by a fresh process after the one that made it was killed.
//
// A Knob is one setting (a sysfs or /proc/sys file, a kernel thread's CPU
// affinity or scheduling class, later a BPF map entry or pin). The Journal
// records a knob's original value on disk before lanes first writes it, so
// Restore can put every original back, byte for byte, from the journal alone.
package knobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/lanesnet/lanes/internal/netnsx"
)

// Knob is one kernel setting lanes may change.
//
// A Knob must marshal to JSON and back (exported fields) because the
// journal stores it that way and rebuilds it in a process that never saw
// the original value.
type Knob interface {
	// Kind names the knob's type in the journal; see Register.
	Kind() string
	// Key identifies the setting uniquely; two knobs with the same key are
	// the same setting.
	Key() string
	// Read returns the current value exactly as the kernel shows it.
	Read() ([]byte, error)
	// Write sets the value; writing what Read returned restores it.
	Write(value []byte) error
}

// A Comparer says whether a value Read returned is the one Write was
// given, for a knob whose Read does not return it byte for byte (fields
// the kernel does not show back). Others are compared as text, trimmed.
type Comparer interface {
	Same(read, wrote []byte) bool
}

// Same reports whether read, a value k's Read returned, is wrote.
func Same(k Knob, read, wrote []byte) bool {
	if c, ok := k.(Comparer); ok {
		return c.Same(read, wrote)
	}
	return bytes.Equal(bytes.TrimSpace(read), bytes.TrimSpace(wrote))
}

// A Tidier has work left around it after its value is back: a reset
// whose knob already holds its original (so is not written) still calls
// Tidy. A pin directory that its datapath's own unpin removed first
// still takes its empty parent.
type Tidier interface {
	Tidy()
}

// ErrGone is wrapped by Read and Write when what the knob lives on (a
// device, a namespace, a kernel thread) no longer exists. Restore skips such
// knobs: there is nothing left to restore. It is the error netnsx wraps for
// a namespace that is gone, so one test covers both.
var ErrGone = netnsx.ErrGone

var (
	kindsMu sync.Mutex
	kinds   = map[string]func() Knob{}
)

// Register makes a knob kind decodable from a journal. newKnob returns a
// pointer to a zero value to unmarshal into. Kinds defined outside this
// package (BPF pins, cpumap entries) register from their package's init.
func Register(kind string, newKnob func() Knob) {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	if _, dup := kinds[kind]; dup {
		panic("knobs: kind registered twice: " + kind)
	}
	kinds[kind] = newKnob
}

// Kinds lists the registered kinds.
func Kinds() []string {
	kindsMu.Lock()
	defer kindsMu.Unlock()
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func decode(kind string, raw json.RawMessage) (Knob, error) {
	kindsMu.Lock()
	newKnob := kinds[kind]
	kindsMu.Unlock()
	if newKnob == nil {
		return nil, fmt.Errorf("unknown knob kind %q (known: %v): was the journal written by a newer lanes?", kind, Kinds())
	}
	k := newKnob()
	if err := json.Unmarshal(raw, k); err != nil {
		return nil, fmt.Errorf("decoding %s knob: %w", kind, err)
	}
	return k, nil
}

func init() {
	Register(kindSysfs, func() Knob { return &SysfsFile{} })
	Register(kindProcSys, func() Knob { return &ProcSysFile{} })
	Register(kindKthreadAffinity, func() Knob { return &KthreadAffinity{} })
	Register(kindKthreadSched, func() Knob { return &KthreadSched{} })
}

// pinnedPID is a pid form's cookie part inside a knob key.
var pinnedPID = regexp.MustCompile(`\bpid:([0-9]+)@[0-9]+`)

// WriterSep ends the part of a knob key that names a piece of state and
// starts the name of one of several writers of it that are each a knob
// of their own (a tcx hook's links).
const WriterSep = "#"

// OlderKey is the key a journal of an older build holds for the same knob:
// without its pid forms' cookies ("pid:N"), and without a writer's name
// (one writer per hook then), so that a follower started by a newer build
// over such an apply knows those knobs as journaled.
func OlderKey(key string) string {
	key, _, _ = strings.Cut(key, WriterSep)
	return pinnedPID.ReplaceAllString(key, "pid:$1")
}
