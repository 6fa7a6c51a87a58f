package workload

import (
	"fmt"
	"sort"
	"strings"
	"sync"
)

// The registry maps workload names to drivers. The tool-driven workloads
// of this package are built in; Register adds others (udp_stress lives in
// bench/stress, which imports this package, so the runner registers it).
var (
	regMu    sync.RWMutex
	registry = map[string]Workload{}
)

func init() {
	for _, w := range []Workload{
		Iperf3{WorkloadName: "tcp_stream"},
		Iperf3{WorkloadName: "udp_stream", UDP: true},
		Iperf3{WorkloadName: "tcp_multi", Multi: true},
		PingPong{},
		Memcached{},
		Nginx{},
	} {
		if err := Register(w); err != nil {
			panic(err)
		}
	}
}

// Register adds w under w.Name(). Names are unique: registering a taken
// name is an error, so two drivers cannot silently shadow each other.
func Register(w Workload) error {
	name := w.Name()
	if name == "" {
		return fmt.Errorf("workload: empty name")
	}
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		return fmt.Errorf("workload %q already registered", name)
	}
	registry[name] = w
	return nil
}

// Lookup returns the workload registered as name.
func Lookup(name string) (Workload, error) {
	regMu.RLock()
	defer regMu.RUnlock()
	if w, ok := registry[name]; ok {
		return w, nil
	}
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("unknown workload %q (have: %s)", name, strings.Join(names, ", "))
}

// Names lists the registered workloads, sorted.
func Names() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
