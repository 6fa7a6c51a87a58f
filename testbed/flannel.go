package testbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/lanesnet/lanes/internal/nsx"
)

// Flannel as a cluster runs it: etcd as the store (on the first host's
// underlay address, as a control-plane node would serve it), flanneld
// with the vxlan backend on each host, which leases the host a pod subnet
// and builds flannel.1 (VNI 1, UDP 8472) with its routes, neighbour and
// forwarding entries, and containers attached the way Flannel's CNI
// plugin attaches them: it delegates to the bridge plugin (bridge cni0,
// the lease's first address as the gateway) with host-local addresses
// from the lease.

// flannelNetwork is the cluster's pod network flanneld leases /24s from.
var flannelNetwork = netip.MustParsePrefix("198.19.0.0/16")

const (
	etcdClientPort = 2379
	etcdPeerPort   = 2380
	// cniDir is where Debian's containernetworking-plugins puts the
	// bridge and host-local plugins.
	cniDir    = "/usr/lib/cni"
	cniBridge = "cni0" // Flannel's CNI plugin's default bridge
)

// FlanneldPath is where `make deps` puts the flanneld it builds from the
// Go module proxy (Flannel is not in Debian).
const FlanneldPath = "/usr/local/lib/lanes/flanneld"

func etcdDaemon(prefix string) daemon {
	d := hostRunDir(prefix, 1)
	return daemon{name: "etcd h1", pidFile: filepath.Join(d, "etcd.pid"), log: filepath.Join(d, "etcd.log")}
}

func flanneldDaemon(prefix string, h int) daemon {
	d := hostRunDir(prefix, h)
	return daemon{name: fmt.Sprintf("flanneld h%d", h), pidFile: filepath.Join(d, "flanneld.pid"), log: filepath.Join(d, "flanneld.log")}
}

func subnetFile(prefix string, h int) string {
	return filepath.Join(hostRunDir(prefix, h), "subnet.env")
}

func (tb *Testbed) etcdURL() string {
	return fmt.Sprintf("http://%s:%d", tb.Hosts[0].UnderlayAddr.Addr(), etcdClientPort)
}

// flannelTools finds etcd and flanneld, and checks for the CNI plugins.
func flannelTools() (etcd, flanneld string, err error) {
	if etcd, err = binary("LANES_ETCD", []string{"/usr/bin/etcd"}, "etcd", "install Debian's etcd-server (make deps)"); err != nil {
		return
	}
	if flanneld, err = binary("LANES_FLANNELD", []string{FlanneldPath}, "flanneld", "run `make deps`, which builds it from the Go module proxy, or set LANES_FLANNELD"); err != nil {
		return
	}
	for _, p := range []string{"bridge", "host-local"} {
		if _, err = os.Stat(filepath.Join(cniDir, p)); err != nil {
			err = fmt.Errorf("CNI %s plugin not found in %s: install Debian's containernetworking-plugins (make deps)", p, cniDir)
			return
		}
	}
	return
}

func (tb *Testbed) buildFlannel() error {
	etcd, flanneld, err := flannelTools()
	if err != nil {
		return err
	}
	prefix := tb.Config.Prefix
	h1 := tb.Hosts[0]
	ip := h1.UnderlayAddr.Addr().String()
	peer := fmt.Sprintf("http://%s:%d", ip, etcdPeerPort)
	e := etcdDaemon(prefix)
	if err := e.start(h1.NetNS, []string{etcd,
		"--name", prefix, "--data-dir", filepath.Join(hostDataDir(prefix, 1), "etcd"),
		"--listen-client-urls", tb.etcdURL(), "--advertise-client-urls", tb.etcdURL(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", prefix + "=" + peer,
	}, nil); err != nil {
		return err
	}
	cfg, _ := json.Marshal(map[string]any{
		"Network": flannelNetwork.String(), "SubnetLen": 24,
		"Backend": map[string]any{"Type": "vxlan"},
	})
	if err := waitFor(20*time.Second, "etcd answering on "+tb.etcdURL(), func() (bool, error) {
		err := tb.etcdPut("/coreos.com/network/config", string(cfg))
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("%w (etcd log: %s)", err, e.logTail())
	}
	// One flanneld at a time, each once the one before holds its lease:
	// two that start together may pick the same free subnet, and the one
	// whose create then finds it taken exits ("subnet already exists"),
	// where a cluster's DaemonSet would restart it and the testbed has
	// nothing to.
	for i := range tb.Hosts {
		h := &tb.Hosts[i]
		f := flanneldDaemon(prefix, i+1)
		os.Remove(subnetFile(prefix, i+1))
		args := []string{flanneld,
			"--etcd-endpoints=" + tb.etcdURL(), "--iface=" + h.Underlay,
			"--subnet-file=" + subnetFile(prefix, i+1), "--ip-masq=false",
		}
		if tb.Config.NoForwardRules {
			args = append(args, "--iptables-forward-rules=false")
		}
		if err := f.start(h.NetNS, args, nil); err != nil {
			return err
		}
		if err := tb.readFlannelHost(i); err != nil {
			return fmt.Errorf("%w (flanneld log: %s)", err, f.logTail())
		}
	}
	for i := range tb.Hosts {
		for k := 1; k <= tb.Config.Containers; k++ {
			ct, err := tb.cniAdd(i+1, k)
			if err != nil {
				return err
			}
			tb.Hosts[i].Containers = append(tb.Hosts[i].Containers, ct)
		}
	}
	return nil
}

// etcdPut writes key = value through etcd's v3 JSON gateway, from the
// first host's namespace (where etcd listens).
func (tb *Testbed) etcdPut(key, value string) error {
	body, _ := json.Marshal(map[string]string{
		"key":   base64.StdEncoding.EncodeToString([]byte(key)),
		"value": base64.StdEncoding.EncodeToString([]byte(value)),
	})
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, Proxy: nil, DialContext: dialIn(tb.Hosts[0].NetNS),
	}}
	resp, err := c.Post(tb.etcdURL()+"/v3/kv/put", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd put %s: %s: %s", key, resp.Status, b)
	}
	return nil
}

// readFlannelHost waits for flanneld's lease and device on host i and
// records them.
func (tb *Testbed) readFlannelHost(i int) error {
	h := &tb.Hosts[i]
	var env map[string]string
	if err := waitFor(30*time.Second, "flanneld's subnet file on "+h.NetNS, func() (bool, error) {
		var err error
		env, err = readEnvFile(subnetFile(tb.Config.Prefix, i+1))
		return err == nil && env["FLANNEL_SUBNET"] != "", err
	}); err != nil {
		return err
	}
	gw, err := netip.ParsePrefix(env["FLANNEL_SUBNET"])
	if err != nil {
		return fmt.Errorf("flanneld's FLANNEL_SUBNET %q: %w", env["FLANNEL_SUBNET"], err)
	}
	h.PodSubnet = gw.Masked()
	nh, closeH, err := handle(h.NetNS)
	if err != nil {
		return err
	}
	defer closeH()
	var vx *netlink.Vxlan
	if err := waitFor(10*time.Second, "flannel.1 on "+h.NetNS, func() (bool, error) {
		l, err := nh.LinkByName("flannel.1")
		if err != nil {
			return false, err
		}
		vx, _ = l.(*netlink.Vxlan)
		return vx != nil && vx.Flags&net.FlagUp != 0, nil
	}); err != nil {
		return err
	}
	h.VXLAN, h.VXLANMAC = vx.Name, vx.HardwareAddr
	h.VNI, h.Port = uint32(vx.VxlanId), vx.Port
	addrs, err := nh.AddrList(vx, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return fmt.Errorf("flannel.1 on %s has no address (%v)", h.NetNS, err)
	}
	p, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	h.VTEPAddr = netip.PrefixFrom(p, ones)
	h.Bridge = cniBridge
	return nil
}

func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// cniConfig is what Flannel's CNI plugin hands the bridge plugin for
// host h: its bridge, the lease's gateway, host-local addresses from the
// lease and a route to the whole pod network.
func (tb *Testbed) cniConfig(h int) ([]byte, error) {
	env, err := readEnvFile(subnetFile(tb.Config.Prefix, h))
	if err != nil {
		return nil, err
	}
	mtu, _ := strconv.Atoi(env["FLANNEL_MTU"])
	return json.Marshal(map[string]any{
		"cniVersion": "0.3.1", "name": "cbr0", "type": "bridge",
		"bridge": cniBridge, "isGateway": true, "ipMasq": false, "hairpinMode": true, "mtu": mtu,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": tb.Hosts[h-1].PodSubnet.String()}}},
			"routes":  []map[string]string{{"dst": env["FLANNEL_NETWORK"]}},
			"dataDir": filepath.Join(hostDataDir(tb.Config.Prefix, h), "cni"),
		},
	})
}

// cni runs the bridge plugin (command ADD or DEL) for container k of host
// h in the host's namespace, as a container runtime does.
func (tb *Testbed) cni(command string, h, k int) ([]byte, error) {
	conf, err := tb.cniConfig(h)
	if err != nil {
		return nil, err
	}
	ns := tb.Config.contNS(h, k)
	cmd := exec.CommandContext(context.Background(), filepath.Join(cniDir, "bridge"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+command, "CNI_CONTAINERID="+ns,
		"CNI_NETNS="+nsx.Path(ns), "CNI_IFNAME=eth0", "CNI_PATH="+cniDir)
	cmd.Stdin = bytes.NewReader(conf)
	var out []byte
	err = nsx.Do(tb.Hosts[h-1].NetNS, func() error {
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("CNI %s of %s: %w: %s", command, ns, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// cniAdd makes container k of host h and attaches it with CNI.
func (tb *Testbed) cniAdd(h, k int) (Container, error) {
	ct := Container{Name: fmt.Sprintf("c%d", k), NetNS: tb.Config.contNS(h, k), Veth: "eth0"}
	if err := nsx.Create(ct.NetNS); err != nil {
		return ct, err
	}
	out, err := tb.cni("ADD", h, k)
	if err != nil {
		nsx.Delete(ct.NetNS)
		return ct, err
	}
	var res struct {
		Interfaces []struct {
			Name, Mac, Sandbox string
		}
		IPs []struct{ Address string }
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) == 0 {
		return ct, fmt.Errorf("CNI ADD of %s: unreadable result %q (%v)", ct.NetNS, out, err)
	}
	if ct.Addr, err = netip.ParsePrefix(res.IPs[0].Address); err != nil {
		return ct, err
	}
	for _, ifc := range res.Interfaces {
		switch {
		case ifc.Sandbox != "" && ifc.Name == ct.Veth:
			ct.MAC, _ = net.ParseMAC(ifc.Mac)
		case ifc.Sandbox == "" && ifc.Name != cniBridge:
			ct.HostVeth = ifc.Name
		}
	}
	if ct.MAC == nil || ct.HostVeth == "" {
		return ct, fmt.Errorf("CNI ADD of %s: result names no container MAC or host veth: %s", ct.NetNS, out)
	}
	// The container side is up and addressed; the loopback is the
	// runtime's to bring up.
	if err := nsx.Do(ct.NetNS, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		return err
	}); err != nil {
		return ct, err
	}
	return ct, nil
}

// cniDel detaches container ct (number k) of host h and removes its
// namespace.
func (tb *Testbed) cniDel(h, k int, ct Container) error {
	if _, err := tb.cni("DEL", h, k); err != nil {
		return err
	}
	killInside(ct.NetNS)
	return nsx.Delete(ct.NetNS)
}

// dialIn dials from inside namespace ns: the socket is made on a thread
// there, and a socket stays in the namespace it was made in whichever
// thread uses it later. (http.Transport dials on goroutines of its own,
// so a request made from inside nsx.Do would still dial from lanes'
// namespace.)
func dialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nsx.Do(ns, func() error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
