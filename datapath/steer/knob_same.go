package steer

// Same compares a setup Read returned with one written: Read rebuilds the
// setup from the pinned maps, which do not hold what only the load used
// (the cpumap queues' size, the kthreads' real-time priorities, the bulk
// queue's policy), so those are left out of the comparison. Values that
// do not decode are compared as they are.
func (k *DatapathKnob) Same(read, wrote []byte) bool {
	if len(read) == 0 || len(wrote) == 0 {
		return len(read) == len(wrote)
	}
	a, errA := DecodeSetup(string(read))
	b, errB := DecodeSetup(string(wrote))
	if errA != nil || errB != nil {
		return string(read) == string(wrote)
	}
	for _, s := range []*Setup{&a, &b} {
		s.QueueSize, s.RTPriority, s.HiRTPriority, s.BulkPolicy = 0, 0, 0, ""
	}
	ea, errA := a.Encode()
	eb, errB := b.Encode()
	return errA == nil && errB == nil && ea == eb
}
