package topology

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

// The kernel's per-namespace fallback tunnels are not container
// interfaces; a configured tunnel of the same name, or a veth, is.
func TestFallbackTunnel(t *testing.T) {
	for _, tc := range []struct {
		l    netlink.Link
		want bool
	}{
		{&netlink.Sittun{LinkAttrs: netlink.LinkAttrs{Name: "sit0"}}, true},
		{&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "tunl0"}}, true},
		{&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "tunl0", Flags: net.FlagUp}}, false},
		{&netlink.Sittun{LinkAttrs: netlink.LinkAttrs{Name: "sit1"}}, false},
		{&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sit0"}}, false},
		{&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}, false},
	} {
		if got := fallbackTunnel(tc.l); got != tc.want {
			t.Errorf("%s %s (flags %v): fallback %v, want %v", tc.l.Type(), tc.l.Attrs().Name, tc.l.Attrs().Flags, got, tc.want)
		}
	}
}
