package attach

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// A kernel without tcx links gets a message that names the need; other
// attach errors pass as they are.
func TestTCXError(t *testing.T) {
	unsupported := errors.Join(errors.New("attach tcx link"), ebpf.ErrNotSupported)
	err := tcxError(unsupported)
	if !strings.Contains(err.Error(), "tcx links need Linux 6.6") || !errors.Is(err, ebpf.ErrNotSupported) {
		t.Errorf("unsupported: %v", err)
	}
	other := errors.New("device busy")
	if err := tcxError(other); err != other {
		t.Errorf("other error changed: %v", err)
	}
}
