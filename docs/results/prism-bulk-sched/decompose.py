#!/usr/bin/env python3
"""Where a sockperf ping-pong's round trip goes, from a perf trace.

Used for docs/results/prism-bulk-sched (README: "PRISM with bulk-sched").
The trace is taken during `lanes bench --modes ... --workloads prio_latency
--repeats 1` with the background's payload changed to 80 bytes (bench/priolat.go
bgPayload), so that the ping's frames (64-byte payload) can be told from
bulk frames by length alone:

  F='len == 92 || len == 106 || len == 142 || len == 156'
  perf record -a -o perf.data \
    -e net:netif_receive_skb --filter "$F" -e net:net_dev_queue --filter "$F" \
    -e net:netif_rx --filter "$F" \
    -e sched:sched_wakeup --filter 'comm == "sockperf"' \
    -e sched:sched_switch --filter 'prev_comm == "sockperf" || next_comm == "sockperf"'
  perf script -i perf.data -F comm,tid,cpu,time,event,trace > perf.txt
  decompose.py perf.txt IRQ_CORE LABEL1,LABEL2,...   (labels: the runs in bench order)

Each run is found by its pair of sockperf processes (server on the IRQ core,
client elsewhere). Every ping is followed through twelve events; the eleven
segments between them are reported as p50, p99 and the mean over the slowest
2% of round trips (which segment the tail is made of).
"""
import re
import statistics as st
import sys

SEGS = [
    ("cli_tx", "client send: container veth, bridge, VXLAN encap to the sender's underlay"),
    ("ring+nic", "underlay ring, NIC poll, XDP, first stage up to the receiver's underlay"),
    ("stages", "VXLAN decap, GRO cell, bridge, container veth, up to the container's eth0"),
    ("to_wake", "UDP delivery until the server is woken"),
    ("srv_wait", "server woken until it is switched in"),
    ("srv_run", "server switched in until its reply is sent (includes preemption)"),
    ("srv_tx", "reply: container veth, bridge, VXLAN encap"),
    ("ring2", "reply: underlay ring and the sender's NIC poll"),
    ("stages2", "reply: decap to the client's eth0"),
    ("cli_wake", "reply delivered until the client is woken"),
    ("cli_wait", "client woken until it is switched in"),
]
STEPS = [("q", "eth0", "106", "cli"), ("q", "ul1", "156", None), ("r", "ul2", "142", None), ("r", "eth0", "92", None),
         ("w", "srv"), ("s", "srv"), ("q", "eth0", "106", "srv"), ("q", "ul2", "156", None), ("r", "ul1", "142", None),
         ("r", "eth0", "92", None), ("w", "cli"), ("s", "cli")]


def kv(rest):
    return dict(re.findall(r"(\w+)=(\S+)", rest))


def pct(a, p):
    a = sorted(a)
    return a[min(len(a) - 1, int(p * len(a)))]


def main():
    ev = []
    for line in open(sys.argv[1]):
        m = re.match(r"\s*(\S+)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)", line)
        if m:
            comm, tid, cpu, t, name, rest = m.groups()
            ev.append((float(t) * 1e6, comm, int(tid), int(cpu), name, rest))
    ev.sort(key=lambda e: e[0])
    irq = int(sys.argv[2])
    labels = sys.argv[3].split(",") if len(sys.argv) > 3 else []
    # Runs: each new pair of sockperf pids starts one.
    first = {}
    for e in ev:
        if e[1] == "sockperf" and e[4] == "net:net_dev_queue":
            first.setdefault(e[2], e[0])
    starts = []
    for pid, t in sorted(first.items(), key=lambda x: x[1]):
        if not starts or t - starts[-1][0] > 1e6:
            starts.append((t, {pid}))
        else:
            starts[-1][1].add(pid)
    for i, (t0, pids) in enumerate(starts):
        t1 = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        run = [e for e in ev if t0 - 1e5 <= e[0] < t1]
        cli = srv = None
        for e in run:
            if e[1] == "sockperf" and e[4] == "net:net_dev_queue" and e[2] in pids:
                if e[3] != irq and cli is None:
                    cli = e[2]
                if e[3] == irq and srv is None:
                    srv = e[2]
        if cli is None or srv is None:
            continue
        pid = {"cli": cli, "srv": srv}
        chains, at, ts = [], 0, []
        for t, comm, tid, cpu, name, rest in run:
            s, d, ok = STEPS[at], kv(rest), False
            if s[0] == "q" and name == "net:net_dev_queue" and d.get("dev") == s[1] and d.get("len") == s[2] and (s[3] is None or tid == pid[s[3]]):
                ok = True
            elif s[0] == "r" and name == "net:netif_receive_skb" and d.get("dev") == s[1] and d.get("len") == s[2]:
                ok = True
            elif s[0] == "w" and name == "sched:sched_wakeup" and int(d.get("pid", -1)) == pid[s[1]]:
                ok = True
            elif s[0] == "s" and name == "sched:sched_switch" and int(d.get("next_pid", -1)) == pid[s[1]]:
                ok = True
            if not ok and name == "net:net_dev_queue" and d.get("dev") == "eth0" and tid == cli and at != 0:
                at, ts, ok = 0, [], True  # a new ping before the last one completed its chain
            if ok:
                ts.append(t)
                at += 1
                if at == len(STEPS):
                    chains.append(ts)
                    at, ts = 0, []
        if not chains:
            continue
        label = labels[i] if i < len(labels) else f"run {i + 1}"
        rtt = [c[-1] - c[0] for c in chains]
        parts = [[c[k + 1] - c[k] for c in chains] for k in range(len(SEGS))]
        slow = sorted(range(len(chains)), key=lambda j: rtt[j])[-max(1, len(chains) // 50):]
        print(f"{label}: {len(chains)} pings traced, round trip p50 {pct(rtt, .5):.0f} us, p99 {pct(rtt, .99):.0f} us (traced; tracing adds to it)")
        print("  " + "".join(f"{n:>10}" for n, _ in SEGS))
        print("  " + "".join(f"{pct(p, .5):10.1f}" for p in parts) + "   p50 us")
        print("  " + "".join(f"{pct(p, .99):10.1f}" for p in parts) + "   p99 us")
        print("  " + "".join(f"{st.mean(parts[k][j] for j in slow):10.1f}" for k in range(len(SEGS))) +
              f"   mean over the slowest 2% (round trip {st.mean(rtt[j] for j in slow):.0f} us)")
    print()
    for n, what in SEGS:
        print(f"{n:>10}: {what}")


if __name__ == "__main__":
    main()
