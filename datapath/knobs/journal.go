package knobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/lanesnet/lanes/internal/netnsx"
)

// JournalFile is the journal's file name inside its state directory.
const JournalFile = "journal.json"

const journalVersion = 1

// Entry is one journaled knob: what it is and the value it had before lanes
// first wrote it.
type Entry struct {
	Kind     string          `json:"kind"`
	Key      string          `json:"key"`
	Knob     json.RawMessage `json:"knob"`
	Original []byte          `json:"original"` // exact bytes, base64 in JSON
	// Text repeats Original for people reading the file; Original is what
	// Restore writes.
	Text string    `json:"text,omitempty"`
	At   time.Time `json:"at"`
	// Wrote is the value lanes last wrote (nil: none recorded, as in
	// journals of older builds). Restore compares it with what it finds:
	// anything else was written by someone else after lanes (irqbalance,
	// tuned, an operator), which it reports as drift.
	Wrote []byte `json:"wrote,omitempty"`
}

// Decode rebuilds the journaled knob, as Restore does.
func (e Entry) Decode() (Knob, error) { return decode(e.Kind, e.Knob) }

type journalDoc struct {
	Version int    `json:"version"`
	Target  string `json:"target"`
	// HostNetNS is the netns cookie of the namespace the journaling
	// process ran in: what an entry's empty namespace ("host") stands
	// for. 0 in journals written before it was kept.
	HostNetNS uint64  `json:"host_netns,omitempty"`
	Entries   []Entry `json:"entries"`
}

// ErrBusy is wrapped by Open when another process (or another part of this
// one) holds the state directory.
var ErrBusy = errors.New("busy")

// Generation names one apply: the key and time of its first journaled
// knob, which stays first until the journal is restored ("" for none).
// A process working for an apply (an agent) compares it with the journal's
// to tell a reset or a newer apply.
func Generation(ents []Entry) string {
	if len(ents) == 0 {
		return ""
	}
	return ents[0].Key + "@" + ents[0].At.Format(time.RFC3339Nano)
}

// Journal records original knob values in DIR/journal.json. It holds an
// exclusive lock on DIR from Open to Close, so two lanes processes never
// journal the same target at once; the kernel drops the lock when a process
// dies, so a killed process never blocks recovery.
type Journal struct {
	dir  string
	lock *os.File
	doc  journalDoc
	keys map[string]bool
}

// Open locks dir (creating it) and loads the journal there, if any. target
// names what the journal is for ("host" or a netns name); a journal left for
// another target in the same directory is an error.
func Open(dir, target string) (*Journal, error) { return open(dir, target, true, 0) }

// OpenWait is Open for the commands a person runs (apply, reset): another
// lanes process that holds dir for a moment (lanes agent adopting a
// container, or parking Falcon) is waited for, up to wait, rather than
// failing at once.
func OpenWait(dir, target string, wait time.Duration) (*Journal, error) {
	return open(dir, target, true, wait)
}

// OpenExisting is Open for a dir that must exist already; it never makes
// one (lanes agent must not bring back the directory a reset removed).
// The error matches os.ErrNotExist when dir is gone.
func OpenExisting(dir, target string) (*Journal, error) { return open(dir, target, false, 0) }

// lockPoll is how long a wait for a lock (OpenWait, LockDir) sleeps at
// most between two tries; the first tries come sooner.
const lockPoll = 50 * time.Millisecond

func open(dir, target string, create bool, wait time.Duration) (*Journal, error) {
	deadline := time.Now().Add(wait)
	var lock *os.File
	for tries := 1; ; tries++ {
		var err error
		lock, err = lockDir(dir, create, deadline)
		if err != nil {
			return nil, err
		}
		// A reset deletes the directory while it holds the lock: whoever
		// waited for that lock then holds one on a directory that is no
		// longer the one at dir, and two processes would journal into
		// what looks like the same place. Check, and start over.
		if StillAt(lock, dir) {
			break
		}
		lock.Close()
		if !create {
			return nil, fmt.Errorf("state dir %s: removed while we waited for it: %w", dir, os.ErrNotExist)
		}
		if tries == 5 {
			return nil, fmt.Errorf("state dir %s keeps being removed and made again: is another lanes process resetting it in a loop? (%w)", dir, ErrBusy)
		}
	}
	j := &Journal{dir: dir, lock: lock, keys: map[string]bool{}}
	here, err := hostCookie()
	if err != nil {
		j.Close()
		return nil, err
	}
	// A temp file is what a process killed between write and rename leaves;
	// the journal it was replacing is still the truth.
	os.Remove(j.path() + ".tmp")
	doc, err := readDoc(j.path())
	switch {
	case errors.Is(err, os.ErrNotExist):
		j.doc = journalDoc{Version: journalVersion, Target: target, HostNetNS: here}
	case err != nil:
		j.Close()
		return nil, err
	default:
		if doc.Target != target {
			j.Close()
			return nil, fmt.Errorf("journal %s is for %q, not %q: use a state dir per target", j.path(), doc.Target, target)
		}
		if err := checkHostNetNS(j.path(), doc, here); err != nil {
			j.Close()
			return nil, err
		}
		j.doc = *doc
		for _, e := range doc.Entries {
			j.keys[e.Key] = true
		}
	}
	return j, nil
}

// checkHostNetNS refuses a journal written by lanes running in another
// network namespace than here. Entries name the namespace lanes ran in as
// "" (sysctls, the host's devices): read from another namespace (a lanes
// run under `ip netns exec`) they would restore, or change, that
// namespace's files instead. Every journal is held to it, also one whose
// entries all name namespaces: the safe side. A journal written before
// the cookie was kept (0) is accepted as before, and is not stamped with
// the cookie of whoever opens it, which may be the wrong namespace.
func checkHostNetNS(path string, doc *journalDoc, here uint64) error {
	if doc.HostNetNS == 0 || doc.HostNetNS == here {
		return nil
	}
	return fmt.Errorf("journal %s was written by lanes running in another network namespace (cookie %d; this process runs in %d), and its host knobs belong to that one: run lanes from there, normally the host's own namespace, not under `ip netns exec` (if that namespace is gone, its knobs went with it: remove %s)", path, doc.HostNetNS, here, filepath.Dir(path))
}

// CheckHostNetNS is the check Open makes, for a process that works from a
// target's journal without opening it (lanes agent, whose Falcon parker
// reads the entries and switches the knobs they name); nil when dir holds
// no journal.
func CheckHostNetNS(dir string) error {
	path := filepath.Join(dir, JournalFile)
	doc, err := readDoc(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	here, err := hostCookie()
	if err != nil {
		return err
	}
	return checkHostNetNS(path, doc, here)
}

// hostCookie is the netns cookie of the calling thread's namespace: the
// namespace this process runs in on every thread but those nsx.Do has
// placed in another one (they stay locked to their goroutine), so never
// call it (or Open) inside nsx.Do or netnsx.Do. netnsx.Cookie asks a socket,
// which keeps the namespace it was made in, so no thread lock is needed.
func hostCookie() (uint64, error) {
	c, err := netnsx.Cookie()
	if err != nil {
		return 0, fmt.Errorf("reading the namespace lanes runs in: %w", err)
	}
	return c, nil
}

// lockDir opens dir (making it when create) and takes its lock, trying
// again until deadline while another process holds it. A directory it
// makes is its owner's alone (0700): anyone who could open it could hold
// its lock and keep apply and reset out.
func lockDir(dir string, create bool, deadline time.Time) (*os.File, error) {
	if create {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating state dir: %w", err)
		}
	}
	lock, err := LockDir(dir, time.Until(deadline))
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	return lock, nil
}

// LockDir takes the exclusive lock (flock) on directory dir, trying again
// until wait has passed while another process, or another open of dir in
// this one, holds it (then ErrBusy). Closing the file drops the lock, and
// so does the death of the process: a killed holder never blocks the
// next. Not through a symlink: a state directory is where reset removes
// files, and a link could point it anywhere.
func LockDir(dir string, wait time.Duration) (*os.File, error) {
	lock, err := os.OpenFile(dir, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s (not a symlink): %w", dir, err)
	}
	deadline := time.Now().Add(wait)
	for poll := time.Millisecond; ; poll = min(2*poll, lockPoll) {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			break
		}
		time.Sleep(poll)
	}
	if err == nil {
		return lock, nil
	}
	lock.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return nil, fmt.Errorf("%s is in use by another lanes process: try again once it is done (%w)", dir, ErrBusy)
	}
	return nil, fmt.Errorf("locking %s: %w", dir, err)
}

// StillAt reports whether the open file (or directory) f still is the one
// at path: one removed, or replaced, while its lock was waited for is not.
func StillAt(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

func readDoc(path string) (*journalDoc, error) {
	b, err := ReadFileNoFollow(path)
	if err != nil {
		return nil, err
	}
	var doc journalDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parsing journal %s: %w (a journal lanes cannot read must be restored by hand)", path, err)
	}
	if doc.Version != journalVersion {
		return nil, fmt.Errorf("journal %s has version %d, this lanes reads %d", path, doc.Version, journalVersion)
	}
	return &doc, nil
}

// ReadEntries returns the entries journaled in dir without locking it, for
// reports; nil when there is no journal.
func ReadEntries(dir string) ([]Entry, error) {
	doc, err := readDoc(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return doc.Entries, nil
}

// Exists reports whether dir holds a journal.
func Exists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, JournalFile))
	return err == nil
}

func (j *Journal) path() string { return filepath.Join(j.dir, JournalFile) }

// Dir is the state directory the journal lives in.
func (j *Journal) Dir() string { return j.dir }

// Len is the number of journaled knobs.
func (j *Journal) Len() int { return len(j.doc.Entries) }

// Entries returns a copy of the journaled entries, oldest first.
func (j *Journal) Entries() []Entry { return append([]Entry(nil), j.doc.Entries...) }

// Close releases the lock. The journal stays on disk.
func (j *Journal) Close() error {
	if j.lock == nil {
		return nil
	}
	err := j.lock.Close() // closing the last fd drops the flock
	j.lock = nil
	return err
}

// Record journals k's current value unless k is journaled already, and
// makes the record durable before returning. Use it before changing k by
// other means than Set.
func (j *Journal) Record(k Knob) error { return j.record(k, nil) }

// record is Record with the original given (nil: read from the knob).
func (j *Journal) record(k Knob, orig []byte) error {
	if j.lock == nil {
		return errors.New("journal is closed")
	}
	if j.keys[k.Key()] {
		return nil
	}
	if orig == nil {
		var err error
		if orig, err = k.Read(); err != nil {
			return fmt.Errorf("recording original of %s: %w", k.Key(), err)
		}
	}
	raw, err := json.Marshal(k)
	if err != nil {
		return fmt.Errorf("encoding knob %s: %w", k.Key(), err)
	}
	e := Entry{Kind: k.Kind(), Key: k.Key(), Knob: raw, Original: orig, At: time.Now().UTC()}
	if utf8.Valid(orig) {
		e.Text = strings.TrimRight(string(orig), "\n")
	}
	j.doc.Entries = append(j.doc.Entries, e)
	if err := j.save(); err != nil {
		j.doc.Entries = j.doc.Entries[:len(j.doc.Entries)-1]
		return err
	}
	j.keys[k.Key()] = true
	return nil
}

// Set writes value to k, journaling k's original value first (once: a knob
// already in the journal keeps its first original) and the value written.
// A write that fails leaves the journal as it found it: a knob lanes never
// changed has nothing to restore (a read-only file would otherwise fail
// every reset after a failed apply), and a knob changed before keeps the
// value it was changed to.
func (j *Journal) Set(k Knob, value []byte) error { return j.set(k, value, nil) }

// SetFrom is Set for a knob whose value now came from lanes, not from
// what it had before: original is what it would hold without lanes. A
// device made while lanes' net.core.rps_default_mask is set starts with
// lanes' RPS map, and restoring that would leave lanes' map behind; its
// original is the default mask's original. A knob already journaled keeps
// its first original, as with Set.
func (j *Journal) SetFrom(k Knob, value, original []byte) error {
	return j.set(k, value, slices.Clone(original))
}

func (j *Journal) set(k Knob, value, original []byte) error {
	had := j.keys[k.Key()]
	if err := j.record(k, original); err != nil {
		return err
	}
	i := j.index(k.Key())
	prev := j.doc.Entries[i].Wrote
	if !bytes.Equal(prev, value) {
		j.doc.Entries[i].Wrote = slices.Clone(value)
		if err := j.save(); err != nil {
			j.doc.Entries[i].Wrote = prev
			return err
		}
	}
	if testAfterRecord != nil {
		testAfterRecord(k)
	}
	werr := k.Write(value)
	if werr == nil {
		return nil
	}
	if had {
		j.doc.Entries[i].Wrote = prev
	} else {
		j.doc.Entries = slices.Delete(j.doc.Entries, i, i+1)
		delete(j.keys, k.Key())
	}
	if err := j.save(); err != nil {
		return fmt.Errorf("%w (and the journal could not drop the write that never happened: %v)", werr, err)
	}
	return werr
}

// index is the position of key's entry (which must exist).
func (j *Journal) index(key string) int {
	return slices.IndexFunc(j.doc.Entries, func(e Entry) bool { return e.Key == key })
}

// Wrote records that value was written to k's journaled entry by other
// means than Set (a runtime writer that checked the journal's generation
// first); false when k is not journaled.
func (j *Journal) Wrote(k Knob, value []byte) (bool, error) {
	if j.lock == nil {
		return false, errors.New("journal is closed")
	}
	i := j.index(k.Key())
	if i < 0 {
		return false, nil
	}
	if bytes.Equal(j.doc.Entries[i].Wrote, value) {
		return true, nil
	}
	prev := j.doc.Entries[i].Wrote
	j.doc.Entries[i].Wrote = slices.Clone(value)
	if err := j.save(); err != nil {
		j.doc.Entries[i].Wrote = prev
		return true, err
	}
	return true, nil
}

// ErrStale is wrapped by RuntimeWrite when the journal is no longer the
// one the writer worked for: a reset removed it, or another apply made a
// new one.
var ErrStale = errors.New("the apply this process worked for is gone")

// RuntimeWrite writes value to k for a process working for an apply (an
// agent), as the one writer of the journal's knobs: under the journal's
// lock (no apply or reset runs meanwhile), only while the journal in dir
// still is generation gen's (Generation; else ErrStale: a reset or a newer
// apply came, and their values stand) and holds k (the plan set k, so its
// original is kept: an agent never touches a knob the plan did not), and
// it records value as what lanes wrote. The write goes to what the journal
// names, not to k as the caller built it: a kernel thread is the one the
// apply changed (its start time), and one that took its name since is
// ErrGone, left as its runtime made it. A journal another lanes process
// holds at the moment is ErrBusy: the caller tries again later.
func RuntimeWrite(dir, gen string, k Knob, value []byte) error {
	j, err := openRuntime(dir, gen, k.Key())
	if err != nil {
		return err
	}
	defer j.Close()
	i := j.index(k.Key())
	if i < 0 {
		return fmt.Errorf("%s: not set by the applied plan (not journaled): a runtime writer changes only knobs the plan set", k.Key())
	}
	journaled, err := j.doc.Entries[i].Decode()
	if err != nil {
		return err
	}
	if err := journaled.Write(value); err != nil {
		return err
	}
	_, err = j.Wrote(k, value)
	return err
}

// RuntimeDo runs f for a process working for an apply, under the
// journal's lock and only while the journal in dir still is generation
// gen's, as RuntimeWrite writes a knob: for what an agent changes that is
// the apply's but no knob (the bulk queue's kthread, which dies with the
// datapath), so that no reset or other apply runs between the check and
// f. what names the change in errors.
func RuntimeDo(dir, gen, what string, f func() error) error {
	j, err := openRuntime(dir, gen, what)
	if err != nil {
		return err
	}
	defer j.Close()
	return f()
}

// openRuntime opens the journal in dir for a runtime writer of
// generation gen: ErrStale when it is gone or another apply's, ErrBusy
// when another lanes process holds it.
func openRuntime(dir, gen, what string) (*Journal, error) {
	doc, err := readDoc(filepath.Join(dir, JournalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w (no journal in %s: reset)", what, ErrStale, dir)
	}
	if err != nil {
		return nil, err
	}
	j, err := open(dir, doc.Target, false, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w (%s removed: reset)", what, ErrStale, dir)
	}
	if err != nil {
		return nil, err
	}
	if g := Generation(j.doc.Entries); gen == "" || g != gen {
		j.Close()
		return nil, fmt.Errorf("%s: %w (journal generation %q, not %q: reset or applied again)", what, ErrStale, g, gen)
	}
	return j, nil
}

// testAfterRecord lets crash tests die between a durable record and the
// write it protects.
var testAfterRecord func(Knob)

// save replaces the journal atomically and durably: temp file, fsync,
// rename, fsync of the directory. A crash leaves either the old or the new
// journal, never a torn one.
func (j *Journal) save() error {
	b, err := json.MarshalIndent(&j.doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding journal: %w", err)
	}
	if err := WriteFileAtomic(j.path(), append(b, '\n')); err != nil {
		return fmt.Errorf("writing journal: %w", err)
	}
	// fsync the directory: makes the rename durable.
	if err := j.lock.Sync(); err != nil {
		return fmt.Errorf("writing journal %s: %w", j.path(), err)
	}
	return nil
}

// ReadFileNoFollow reads a state file, refusing a symlink in its place
// (ELOOP): lanes' state files are its own, and a link someone put there
// could make it read, and act on, any file.
func ReadFileNoFollow(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// WriteFileAtomic replaces path with b: temp file, fsync, rename. A crash
// leaves the old or the new content, never a torn file. The temp file is
// not opened through a symlink (the rename replaces one at path itself).
func WriteFileAtomic(path string, b []byte) error { return replaceFile(path, b, true) }

// PublishFile is WriteFileAtomic without the fsync, for a status file
// rewritten every second or so: readers see the old content or the new,
// never a torn file, while the system runs; a crash may lose it. It
// spares a journal commit each time where the directory is on a disk.
func PublishFile(path string, b []byte) error { return replaceFile(path, b, false) }

func replaceFile(path string, b []byte, sync bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Skip is a knob Restore did not write back, and why.
type Skip struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// Report says what Restore did.
type Report struct {
	Restored []string `json:"restored"`
	// Drift are knobs someone changed after lanes wrote them: what
	// Restore found, against what lanes wrote (restored all the same).
	Drift []Skip `json:"drift,omitempty"`
	// Skipped knobs live on something that is gone (a deleted device or
	// namespace, an exited kernel thread): nothing to restore.
	Skipped []Skip `json:"skipped,omitempty"`
	// Failed knobs could not be restored; they stay in the journal.
	Failed []Skip `json:"failed,omitempty"`
}

// Restore writes every original value back, newest first, so a knob
// changed in several steps ends at its first value and settings that depend
// on each other unwind in order. Knobs whose device, namespace or thread is
// gone are skipped and reported. A failure does not stop the others; the
// journal then keeps only the failed entries (for another try), otherwise it
// is removed.
func (j *Journal) Restore() (*Report, error) {
	if j.lock == nil {
		return nil, errors.New("journal is closed")
	}
	rep := &Report{Restored: []string{}}
	var failed []Entry
	for i := len(j.doc.Entries) - 1; i >= 0; i-- {
		e := j.doc.Entries[i]
		if restoreEntry(e, rep) != nil {
			failed = append([]Entry{e}, failed...)
		}
	}
	if len(failed) == 0 {
		if err := os.Remove(j.path()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return rep, fmt.Errorf("removing journal: %w", err)
		}
		j.lock.Sync()
		j.doc.Entries = nil
		j.keys = map[string]bool{}
		return rep, nil
	}
	j.doc.Entries = failed
	j.keys = map[string]bool{}
	for _, e := range failed {
		j.keys[e.Key] = true
	}
	if err := j.save(); err != nil {
		return rep, err
	}
	return rep, fmt.Errorf("%d of %d knobs could not be restored (kept in %s), first: %s",
		len(failed), len(rep.Restored)+len(rep.Skipped)+len(failed), j.path(), rep.Failed[0].Reason)
}

// Forget restores the entries with the given keys, newest first, and takes
// them out of the journal, which keeps the rest: what a follower of
// containers does for the knobs of a container that went (their device is
// gone: nothing to write back, but a link pin to remove) or for changes it
// made in a round that failed half-way. A knob whose device is gone is
// taken out too (reported skipped). The first entry (the one that names the
// apply) is never forgotten. A knob that cannot be restored stays in the journal.
func (j *Journal) Forget(keys []string) (*Report, error) {
	return j.forget(keys, true, nil)
}

// Drop takes the entries with the given keys out of the journal without
// writing their originals back, except the ones in release (lanes' own
// objects, such as a link pin, whose restore writes nothing onto a
// device). It is for entries whose device was replaced by another of the
// same name: the originals are the old device's, and writing them onto
// the new one would overwrite what its runtime gave it. A release that
// fails still drops its entry (reported failed).
func (j *Journal) Drop(keys []string, release map[string]bool) (*Report, error) {
	return j.forget(keys, false, release)
}

// forget is Forget (restore: every entry, keeping those that fail) and
// Drop (only release's, dropping every entry).
func (j *Journal) forget(keys []string, restore bool, release map[string]bool) (*Report, error) {
	if j.lock == nil {
		return nil, errors.New("journal is closed")
	}
	drop := map[string]bool{}
	for _, k := range keys {
		drop[k] = true
	}
	rep := &Report{Restored: []string{}}
	var keep []Entry
	var errs []error
	for i := len(j.doc.Entries) - 1; i >= 0; i-- {
		e := j.doc.Entries[i]
		if !drop[e.Key] || i == 0 {
			keep = append([]Entry{e}, keep...)
			continue
		}
		if !restore {
			if release[e.Key] {
				restoreEntry(e, rep) // failures are in rep; the entry goes regardless
			} else {
				rep.Skipped = append(rep.Skipped, Skip{Key: e.Key, Reason: "dropped without restoring: its device was replaced"})
			}
			continue
		}
		if err := restoreEntry(e, rep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Key, err))
			keep = append([]Entry{e}, keep...)
		}
	}
	old := j.doc.Entries
	j.doc.Entries = keep
	if err := j.save(); err != nil {
		j.doc.Entries = old
		return rep, err
	}
	j.keys = map[string]bool{}
	for _, e := range keep {
		j.keys[e.Key] = true
	}
	return rep, joinLine(errs)
}

// joinLine joins errors on one line (errors.Join puts each on its own),
// so a message built around it stays one line.
func joinLine(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// restoreEntry writes e's original value back and records the outcome in
// rep: restored, skipped (what it lives on is gone) or failed. It returns
// the error only for a failure, the case where the entry must stay. A knob
// that already holds its original is not written (restoring it is done:
// a read-only knob lanes never changed must not fail a reset), and one
// that holds neither its original nor what lanes wrote is reported as
// drift, then restored.
func restoreEntry(e Entry, rep *Report) error {
	k, err := decode(e.Kind, e.Knob)
	if err == nil {
		cur, rerr := k.Read()
		switch {
		case rerr == nil && bytes.Equal(cur, e.Original):
			if t, ok := k.(Tidier); ok {
				t.Tidy()
			}
			rep.Restored = append(rep.Restored, e.Key)
			return nil
		case rerr == nil && e.Wrote != nil && !Same(k, cur, e.Wrote):
			rep.Drift = append(rep.Drift, Skip{Key: e.Key, Reason: fmt.Sprintf("found %q where lanes wrote %q: changed by someone else since; put back to %q",
				strings.TrimSpace(string(cur)), strings.TrimSpace(string(e.Wrote)), strings.TrimSpace(string(e.Original)))})
		}
		err = k.Write(e.Original)
	}
	switch {
	case err == nil:
		rep.Restored = append(rep.Restored, e.Key)
	case errors.Is(err, ErrGone):
		rep.Skipped = append(rep.Skipped, Skip{Key: e.Key, Reason: err.Error()})
	default:
		rep.Failed = append(rep.Failed, Skip{Key: e.Key, Reason: err.Error()})
		return err
	}
	return nil
}
