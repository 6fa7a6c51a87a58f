//go:build linux

package steer

// Micro is MFLOW's micro-flow cutting (bpf/mflow.h).
type Micro struct{ *core }

func (d *Datapath) Micro() Micro { return Micro{d.core} }

// MicroFlowState is one flow's MFLOW state (Config.MFlow): the split stage
// keeps it for SplitAtIRQ, the bridge stage for SplitAtBridge.
type MicroFlowState struct {
	// Elephant: the flow is being split.
	Elephant bool
	// Started is the number of micro-flows started; the current one's
	// sequence number is Started-1.
	Started uint32
	// CPUIndex is the index into Config.CPUs of the current micro-flow.
	CPUIndex uint32
	// Frames is how many frames were sent as micro-flows.
	Frames uint64
	// Seen is the highest sequence number whose frames the skb side (tc
	// ingress on the underlay) read back from their metadata, valid when
	// SeenAny (split stage only).
	Seen    uint32
	SeenAny bool
}

// mfSeen is bpf/mflow.h's MF_SEEN: the flow's mf_seen holds a sequence number.
const mfSeen = 1 << 32

// mfBig is bpf/mflow.h's MF_BIG: the flow is split. TestConstsMatchC checks
// both.
const mfBig = 1

func microFlowState(s *steerSteerFlowState) MicroFlowState {
	return MicroFlowState{
		Elephant: s.MfElephant&mfBig != 0,
		Started:  s.MfStarted,
		CPUIndex: s.MfCore,
		Frames:   s.MfFrames,
		Seen:     uint32(s.MfSeen),
		SeenAny:  s.MfSeen&mfSeen != 0,
	}
}

// PerCore reads how many micro-flows (Config.MFlow) were sent to
// each core (index: core number).
func (d Micro) PerCore() ([MaxCPUs]uint64, error) {
	var out [MaxCPUs]uint64
	keys := make([]uint32, MaxCPUs)
	vals := make([]uint64, MaxCPUs)
	if err := readAll(d.objs.SteerMfCores, keys, vals, "micro-flows per core"); err != nil {
		return out, err
	}
	for i, k := range keys {
		out[k%MaxCPUs] = vals[i]
	}
	return out, nil
}
