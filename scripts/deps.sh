#!/usr/bin/env bash
# Installs what lanes needs on Debian (12+), idempotently: the BPF toolchain
# (clang, llvm, libbpf headers) and the workloads the seed papers used
# (iperf3, sockperf, memcached + memaslap, nginx + wrk), and nft, with which
# the tests put a filter on the path PRISM-sync must not skip. Skips apt entirely
# when everything is present, so `make test` can depend on it cheaply.
set -euo pipefail

pkgs=(clang llvm libbpf-dev iperf3 sockperf memcached libmemcached-tools nginx-light wrk nftables
	# clang 14 drops the kptr type tags the BPF qdisc (datapath/reorder) needs;
	# its clang-format keeps the BPF C's layout one version's (make lint);
	# bpf2go strips with the compiler's own llvm-strip (llvm-19)
	clang-19 llvm-19 clang-format-19
	# the real overlays' daemons (lanes testbed up --overlay flanneld|dockerd):
	# flanneld's store, dockerd, the CNI plugins Flannel's delegates to, the
	# containers' image, and iptables, which both daemons program
	etcd-server docker.io containernetworking-plugins busybox-static iptables)

# shellcheck source=scripts/debs.sh
. "$(dirname "$0")/debs.sh"
if install_debs deps "${pkgs[@]}"; then
	# Debian starts packaged daemons; the benchmark runs its own copies
	# inside namespaces, so stop the system ones where an init system runs.
	for svc in nginx memcached etcd docker containerd; do
		if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
			systemctl disable --now "$svc" >/dev/null 2>&1 || true
		fi
	done
fi

# Go is not taken from Debian: bookworm's golang is 1.19, older than the
# module needs. A Go >= 1.21 on PATH fetches the exact toolchain go.mod asks
# for through the module proxy by itself.
if ! command -v go >/dev/null; then
	echo "deps: no Go toolchain on PATH: install Go >= 1.24 from go.dev/dl (Debian 12's golang-go is too old)" >&2
	exit 1
fi
gov=$(go env GOVERSION | sed 's/^go//')
if [[ "$(printf '%s\n1.21\n' "$gov" | sort -V | head -1)" != "1.21" ]]; then
	echo "deps: Go $gov is too old: install Go >= 1.24 from go.dev/dl" >&2
	exit 1
fi
# The guest-kernel harness (make vm-test, make test's guest part): QEMU,
# kmod, udev, file, python3-venv from Debian; virtme-ng in /opt/lanes-vng.
"$(dirname "$0")/vm/deps.sh"

# Flannel is not in Debian: built from the Go module proxy (cached).
"$(dirname "$0")/flanneld.sh"

echo "deps: ok (go $gov, clang $(clang -dumpversion), $(iperf3 --version | head -1 | cut -d' ' -f1-2))"
