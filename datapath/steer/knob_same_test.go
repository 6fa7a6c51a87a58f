package steer

import "testing"

// What Read cannot see back (queue size, real-time priorities, the bulk
// queue's policy) is no drift; anything else is.
func TestDatapathKnobSame(t *testing.T) {
	k := &DatapathKnob{}
	wrote := `{"enabled":true,"cpus":[0,1],"flowlet_ns":1000000,"vxlan_port":4789,"vnis":[42],"cpumap":[0,1],"queue_size":2048,"rt_priority":50}`
	read := `{"enabled":true,"cpus":[0,1],"flowlet_ns":1000000,"vxlan_port":4789,"vnis":[42],"cpumap":[0,1]}`
	if !k.Same([]byte(read), []byte(wrote)) {
		t.Error("a setup read back without the load-only fields counts as changed")
	}
	other := `{"enabled":true,"cpus":[0],"flowlet_ns":1000000,"vxlan_port":4789,"vnis":[42],"cpumap":[0,1]}`
	if k.Same([]byte(other), []byte(wrote)) {
		t.Error("another core set counts as the same")
	}
	if k.Same(nil, []byte(wrote)) || !k.Same(nil, nil) {
		t.Error("absent against present")
	}
}
