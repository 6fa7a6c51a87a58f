package steer

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestRPSHashSelectsCore: the hash the tc programs set makes the kernel's
// RPS (reciprocal_scale over a mask of n cores) pick exactly the idx-th
// core, and is never 0 ("no hash").
func TestRPSHashSelectsCore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	hashes := []uint32{0, 1, 2, math.MaxUint32, math.MaxUint32 - 1, 1 << 31}
	for range 2000 {
		hashes = append(hashes, rng.Uint32())
	}
	for n := 1; n <= 8; n++ {
		_, span := rpsRange(0, n)
		for idx := range n {
			for _, fh := range append(hashes, span-1, span, span+1) {
				for _, counted := range []bool{false, true} {
					for stage := StageBridge; stage <= StageContainer; stage++ {
						for _, epoch := range []uint32{0, 5, HashEpochs - 1} {
							h := RPSHash(idx, n, fh, stage, epoch, counted)
							if h == 0 {
								t.Fatalf("RPSHash(%d, %d, %#x, %d, %d, %v) = 0", idx, n, fh, stage, epoch, counted)
							}
							if got := RPSIndex(h, n); got != idx {
								t.Fatalf("RPSHash(%d, %d, %#x, %d, %d, %v) = %#x selects core %d", idx, n, fh, stage, epoch, counted, h, got)
							}
							if h&1 == 1 != counted {
								t.Fatalf("RPSHash(%d, %d, %#x, %d, %d, %v) = %#x: low bit is not the counted mark", idx, n, fh, stage, epoch, counted, h)
							}
							if lo, _ := rpsRange(idx, n); h != 2 && (h-(lo+1)&^1)>>1%HashEpochs != epoch {
								t.Fatalf("RPSHash(%d, %d, %#x, %d, %d, %v) = %#x: epoch bits say %d", idx, n, fh, stage, epoch, counted, h, (h-(lo+1)&^1)>>1%HashEpochs)
							}
						}
					}
				}
			}
		}
	}
	// The largest set too: the ranges must tile the hash space.
	for idx := range MaxCPUs {
		lo, span := rpsRange(idx, MaxCPUs)
		if RPSIndex(lo, MaxCPUs) != idx || RPSIndex(lo+span-1, MaxCPUs) != idx {
			t.Fatalf("core %d of %d: range [%#x, +%#x) leaves the core", idx, MaxCPUs, lo, span)
		}
	}
}

// TestRPSHashKeepsFlowsApart: flows on one core keep distinct hashes, so
// GRO and RPS flow tables still tell them apart.
func TestRPSHashKeepsFlowsApart(t *testing.T) {
	seen := map[uint32]bool{}
	for sport := uint16(1000); sport < 1100; sport++ {
		seen[RPSHash(1, 4, FlowHash(innerSrc, innerDst, sport, 80, protoTCP), StageBridge, 0, true)] = true
	}
	if len(seen) < 99 {
		t.Errorf("100 flows got %d distinct hashes", len(seen))
	}
}

func TestRPSIndex(t *testing.T) {
	for n := 1; n <= MaxCPUs; n++ {
		if RPSIndex(0, n) != 0 || RPSIndex(math.MaxUint32, n) != n-1 {
			t.Fatalf("n=%d: RPSIndex(0)=%d RPSIndex(max)=%d", n, RPSIndex(0, n), RPSIndex(math.MaxUint32, n))
		}
	}
}

// TestBucketSpread: flows that differ in one port spread over all buckets
// of every stage, about evenly.
func TestBucketSpread(t *testing.T) {
	const flows = Buckets * 64
	for stage := range NumStages {
		var n [Buckets]int
		for i := range flows {
			fh := FlowHash(innerSrc, innerDst, uint16(i), 5201, protoTCP)
			n[Bucket(fh, 7, stage)]++
		}
		for b, c := range n {
			if c < 64/2 || c > 64*2 {
				t.Fatalf("stage %s: bucket %d has %d of %d flows", StageName(stage), b, c, flows)
			}
		}
	}
}

// TestFlowHashInputs: every field of the 5-tuple changes the hash.
func TestFlowHashInputs(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	base := FlowHash(a, b, 1, 2, protoTCP)
	for name, h := range map[string]uint32{
		"src":   FlowHash(b, b, 1, 2, protoTCP),
		"dst":   FlowHash(a, a, 1, 2, protoTCP),
		"sport": FlowHash(a, b, 3, 2, protoTCP),
		"dport": FlowHash(a, b, 1, 3, protoTCP),
		"proto": FlowHash(a, b, 1, 2, protoUDP),
		"swap":  FlowHash(b, a, 2, 1, protoTCP),
	} {
		if h == base {
			t.Errorf("changing %s keeps the hash %#x", name, h)
		}
	}
	if FlowHash(netip.AddrFrom16(a.As16()), b, 1, 2, protoTCP) != base {
		t.Error("an IPv4-mapped address hashes differently from the IPv4 one")
	}
}

func TestStageName(t *testing.T) {
	for s, want := range []string{"split", "bridge", "container"} {
		if got := StageName(s); got != want {
			t.Errorf("StageName(%d) = %q, want %q", s, got, want)
		}
	}
}
