package attach

import "testing"

func TestTCXKernelVersion(t *testing.T) {
	for rel, ok := range map[string]bool{
		"6.6.0":           true,
		"6.18.44-fc-v445": true,
		"7.0.1":           true,
		"6.5.13-generic":  false,
		"5.15.0-91":       false,
		"4.19.0":          false,
	} {
		err := tcxSupported(rel)
		if (err == nil) != ok {
			t.Errorf("%s: %v", rel, err)
		}
		if !ok && err != nil && err.Error() != "tcx needs Linux 6.6 or newer (this kernel: "+rel+")" {
			t.Errorf("%s: message %q", rel, err)
		}
	}
	if tcxSupported("garbage") == nil {
		t.Error("garbage release accepted")
	}
}
