package topology

import (
	"net"
	"slices"
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

func TestParseNetNSMounts(t *testing.T) {
	info := `22 1 0:21 / /proc rw,nosuid - proc proc rw
610 27 0:4 net:[4026532290] /run/netns/lanes-h1 rw shared:261 - nsfs nsfs rw
611 27 0:4 net:[4026532391] /run/docker/netns/1-osghgyvn34 rw - nsfs nsfs rw
612 27 0:4 mnt:[4026532400] /run/docker/mntns rw - nsfs nsfs rw
613 27 0:4 net:[4026532392] /var/lib/my\040dir/ns rw - nsfs nsfs rw
`
	got := parseNetNSMounts(info)
	want := []string{"/run/netns/lanes-h1", "/run/docker/netns/1-osghgyvn34", "/var/lib/my dir/ns"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
