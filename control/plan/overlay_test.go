package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/lanesnet/lanes/internal/cpuset"
	"github.com/lanesnet/lanes/internal/kthread"
	"github.com/lanesnet/lanes/topology"
)

// Where a NIC is polled: by its threaded NAPI kthreads where they are
// pinned, else in softirq where its receive interrupts go; unknown when
// either may run on several cores, or a virtual NIC has neither.
func TestIRQCPUs(t *testing.T) {
	thread := func(cpus ...int) kthread.Info { return kthread.Info{Comm: "napi/ul2-9", CPUs: cpus} }
	rx := func(irq int, name string, cpus ...int) topology.IRQ {
		return topology.IRQ{IRQ: irq, Name: name, CPUs: cpus, Receive: true}
	}
	for _, tc := range []struct {
		name string
		devs []topology.Device
		want []int
	}{
		{"threaded, pinned", []topology.Device{{Threaded: "1", NAPIThreads: []kthread.Info{thread(1)}}}, []int{1}},
		{"threaded, free", []topology.Device{{Threaded: "1", NAPIThreads: []kthread.Info{thread(0, 1)}}}, nil},
		// A threaded NIC's interrupts only wake its threads.
		{"threaded, threads pinned, IRQs elsewhere", []topology.Device{{Threaded: "1", NAPIThreads: []kthread.Info{thread(1)}, IRQs: []topology.IRQ{rx(40, "eth0-TxRx-0", 0)}}}, []int{1}},
		{"softirq, two queues", []topology.Device{{Threaded: "0", IRQs: []topology.IRQ{rx(40, "eth0-TxRx-0", 3), rx(41, "eth0-TxRx-1", 2), {IRQ: 42, Name: "eth0", CPUs: []int{0}}}}}, []int{2, 3}},
		{"softirq, an IRQ on several cores", []topology.Device{{Threaded: "0", IRQs: []topology.IRQ{rx(40, "eth0-TxRx-0", 2, 3)}}}, nil},
		{"softirq, no IRQ (veth)", []topology.Device{{Threaded: "0"}}, nil},
		{"one NIC known, one not", []topology.Device{{Threaded: "0", IRQs: []topology.IRQ{rx(40, "eth0-rx-0", 1)}}, {Threaded: "0"}}, nil},
		{"no underlay", nil, nil},
	} {
		tp := &topology.Topology{Underlays: tc.devs}
		if got := IRQCPUs(tp); !slices.Equal(got, tc.want) {
			t.Errorf("%s: IRQ cores %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A core list the user gave wins over what was read; a bad one is
// refused with what to write.
func TestIRQCPUsGiven(t *testing.T) {
	tp := &topology.Topology{Underlays: []topology.Device{{Threaded: "1", NAPIThreads: []kthread.Info{{CPUs: []int{1}}}}}}
	if got := IRQCPUsOr(tp, []int{0}); !slices.Equal(got, []int{0}) {
		t.Errorf("given [0]: %v", got)
	}
	if got := IRQCPUsFor(tp, map[string]string{IRQKey: "2-3"}); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("given 2-3: %v", got)
	}
	if got := IRQCPUsFor(tp, nil); !slices.Equal(got, []int{1}) {
		t.Errorf("none given: %v, want what was read, [1]", got)
	}
	for _, bad := range []string{"", "x", "1-", ","} {
		if _, err := cpuset.ParseList(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Distinct namespaces and devices never share a link pin: not a dotted
// device and one with an underscore in its place, not the '_' between
// the namespace and the device moved, not one escaped and one plain.
func TestLinkPinInjective(t *testing.T) {
	type at struct{ ns, dev string }
	for _, pair := range [][2]at{
		{{"", "eth0.100"}, {"", "eth0_100"}},
		{{"a", "b_c"}, {"a_b", "c"}},
		{{"a", "b.c"}, {"a_b", "c"}},
		{{"/run/netns/a", "b_c"}, {"/run/netns/a_b", "c"}},
		{{"", "%eth0%2E1"}, {"", "eth0.1"}},
		{{"", "eth0%5F1"}, {"", "eth0_1"}},
		{{"pid:1", "x"}, {"pid_1", "x"}},
	} {
		p, q := LinkPin("d", "xdp", pair[0].ns, pair[0].dev), LinkPin("d", "xdp", pair[1].ns, pair[1].dev)
		if p == q {
			t.Errorf("%+v and %+v share the pin %s", pair[0], pair[1], p)
		}
	}
	// Every namespace and device over a small alphabet of the characters
	// that matter.
	words := func(prefixes, alphabet []string, n int) []string {
		out := slices.Clone(prefixes)
		for cur := prefixes; n > 0; n-- {
			var next []string
			for _, w := range cur {
				for _, c := range alphabet {
					next = append(next, w+c)
				}
			}
			out, cur = append(out, next...), next
		}
		return out
	}
	seen := map[string]at{}
	for _, ns := range words([]string{"", "a", "pid:", "/run/netns/", "run_netns_"}, []string{"a", "1", "_", ":", "/"}, 3) {
		for _, dev := range words([]string{"a"}, []string{"a", "_", ".", "%"}, 4) {
			pin := LinkPin("d", "xdp", ns, dev)
			if prev, ok := seen[pin]; ok && prev != (at{ns, dev}) {
				t.Fatalf("%+v and %+v share the pin %s", prev, at{ns, dev}, pin)
			}
			seen[pin] = at{ns, dev}
			if strings.ContainsRune(pin, '.') {
				t.Fatalf("%+v: pin %s has a dot", at{ns, dev}, pin)
			}
		}
	}
	if len(seen) < 50000 {
		t.Fatalf("premise: %d distinct pairs tried", len(seen))
	}
}

// bpffs refuses file names with a dot; pins of a namespace bound under a
// dotted path, or of a device with a dot in its name, must not have one.
func TestPinNamesHaveNoDot(t *testing.T) {
	for _, tc := range []struct{ ns, dev string }{
		{"/run/lanes/testbed/dk.d/h2/docker/netns/lb_st8whrjdq", "eth0"},
		{"lanes-h2", "flannel.1"},
		{"", "eth0.100"},
	} {
		dir := PinDir(tc.ns)
		pin := LinkPin(dir, "tcx-seen", tc.ns, tc.dev)
		for _, name := range []string{dir[len(BPFFS)+1:], pin[len(dir)+1:]} {
			if strings.ContainsRune(name, '.') {
				t.Errorf("netns %q dev %q: pin name %q has a dot", tc.ns, tc.dev, name)
			}
		}
	}
	if got := LinkPin(PinDir("lanes-h2"), "xdp", "lanes-h2", "eth0"); got != BPFFS+"/lanes/lanes-h2/link_xdp_lanes-h2_eth0" {
		t.Errorf("a plain device's link pin changed: %s", got)
	}
	if PinDir("lanes-h2") != BPFFS+"/lanes/lanes-h2" {
		t.Errorf("a plain target's pin directory changed: %s", PinDir("lanes-h2"))
	}
}
