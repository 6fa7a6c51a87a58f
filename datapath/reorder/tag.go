package reorder

// The micro-flow tag in skb->priority, as mflow_tag.h defines it.
const (
	tagMagic     = 0xa0000000
	tagMagicMask = 0xe0000000
	tagGenShift  = 27
	tagGenMask   = 0x3
	tagFlowShift = 16
	tagFlowMask  = 0x7ff
	tagSeqMask   = 0xffff
)

// Tag is the priority the splitter gives the frames of micro-flow seq of
// the flow whose hash is flowHash, split by a datapath of generation gen.
func Tag(flowHash, gen, seq uint32) uint32 {
	return tagMagic | (gen&tagGenMask)<<tagGenShift | (flowHash&tagFlowMask)<<tagFlowShift | seq&tagSeqMask
}

// Tagged reports whether a priority is a micro-flow tag, and if so its
// flow bits and sequence number.
func Tagged(prio uint32) (flow, seq uint32, ok bool) {
	if prio&tagMagicMask != tagMagic {
		return 0, 0, false
	}
	return prio >> tagFlowShift & tagFlowMask, prio & tagSeqMask, true
}
