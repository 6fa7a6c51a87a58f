package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/lanesnet/lanes/testbed"
)

func init() { register(newTestbedCmd) }

func newTestbedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "testbed",
		Short: "Build, inspect and remove a two-host container overlay testbed in network namespaces",
	}
	var cfg testbed.Config
	var topo string
	var forwardRules bool
	up := &cobra.Command{
		Use:   "up",
		Short: "Build the testbed (idempotent: an intact testbed with the same settings is left as it is)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Topology = testbed.Topology(topo)
			cfg.NoForwardRules = !forwardRules
			tb, err := testbed.Up(cfg)
			if err != nil {
				return err
			}
			return tb.WriteStatus(cmd.OutOrStdout())
		},
	}
	up.Flags().StringVar(&cfg.Prefix, "prefix", "lanes", "name prefix of the testbed's namespaces")
	up.Flags().StringVar(&topo, "topology", "", "the layout lanes builds itself: docker (VXLAN in a bridge; the default), flannel (L3 VXLAN + pod bridge) or calico (L3 VXLAN + a routed veth per pod)")
	up.Flags().BoolVar(&forwardRules, "flanneld-forward-rules", true, "with --overlay flanneld: let flanneld add its FORWARD accept rules (false: --iptables-forward-rules=false, as where the host's FORWARD policy accepts; flanneld then adds no iptables table)")
	up.Flags().StringVar(&cfg.Overlay, "overlay", "", "have real daemons build the overlay instead: flanneld (etcd + flanneld's vxlan backend, containers through the CNI bridge plugin) or dockerd (a dockerd per host, a swarm, an attachable overlay network)")
	up.Flags().IntVar(&cfg.Containers, "containers", 2, "containers per host")
	up.Flags().IntVar(&cfg.IRQCPU, "irq-cpu", runtime.NumCPU()-1, "core that polls the underlay NICs (like a NIC's IRQ affinity)")
	up.Flags().BoolVar(&cfg.SenderApart, "sender-apart", false, "poll the sending host's underlay NIC on another core than --irq-cpu, as if it were another machine, its poller at SCHED_FIFO 1 as hardware would take the core (default: both on --irq-cpu)")
	up.Flags().StringVar(&cfg.NIC, "nic", testbed.NICThreaded, "how each host polls its underlay NIC on the IRQ core: threaded (a pinned NAPI kthread, each poll's frames carried to their sockets before the next poll), softirq (NET_RX softirq, in one poll list with the later stages, as most physical NIC drivers) or veth (a plain veth pair: each host's receive path starts on its sender's core, no IRQ core lanes can read)")
	up.Flags().IntVar(&cfg.MTU, "mtu", 1500, "underlay MTU")
	var vni uint
	up.Flags().UintVar(&vni, "vni", 42, "VXLAN network identifier")
	up.PreRun = func(*cobra.Command, []string) { cfg.VNI = uint32(vni) }

	var prefix string
	down := &cobra.Command{
		Use:   "down",
		Short: "Remove the testbed and everything in it (works from any state)",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return testbed.Down(prefix) },
	}
	down.Flags().StringVar(&prefix, "prefix", "lanes", "name prefix of the testbed's namespaces")

	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "List the testbed's devices, addresses and where each NAPI instance runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tb, err := testbed.Load(prefix)
			if err != nil {
				return err
			}
			if !asJSON {
				return tb.WriteStatus(cmd.OutOrStdout())
			}
			st, err := tb.Status()
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(map[string]any{"testbed": tb, "devices": st})
		},
	}
	status.Flags().StringVar(&prefix, "prefix", "lanes", "name prefix of the testbed's namespaces")
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var host int
	add := &cobra.Command{
		Use:   "add-container",
		Short: "Start one more container on a host of the testbed, as a container runtime would (lanes agent adopts it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := testbed.AddContainer(prefix, host)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s: netns %s, %s %s, host side %s\n", c.Name, c.NetNS, c.Veth, c.Addr, c.HostVeth)
			return nil
		},
	}
	del := &cobra.Command{
		Use:   "del-container NAME",
		Short: "Remove a container (c3, ...) from a host of the testbed",
		Args:  cobra.ExactArgs(1),
		RunE:  func(_ *cobra.Command, args []string) error { return testbed.RemoveContainer(prefix, host, args[0]) },
	}
	for _, c := range []*cobra.Command{add, del} {
		c.Flags().StringVar(&prefix, "prefix", "lanes", "name prefix of the testbed's namespaces")
		c.Flags().IntVar(&host, "host", 2, "1 (the sender) or 2 (the receiver)")
	}
	cmd.AddCommand(up, down, status, add, del)
	return cmd
}
