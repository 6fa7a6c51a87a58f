#!/usr/bin/env bash
# run.sh [options] -- CMD ARGS...: boots a guest kernel with virtme-ng under
# QEMU's TCG (no KVM here), runs CMD ARGS as root inside it and exits with
# CMD's exit status; CMD's output is this script's output.
#
#   --kernel K    newest (default), 6.12 (scripts/vm/fetch.sh fetches and
#                 caches Debian's image) or the path of a vmlinuz
#   --timeout S   give up after S seconds (default 1200): exit 124
#   --out DIR     the guest's writable output directory (default: a new
#                 /tmp/lanes-vm.XXXXXX); the same path inside and outside
#   --cpus N      vCPUs (default 2)
#   --memory M    guest memory (default 3G)
#   --console     the guest kernel's messages of warning level and above
#                 (an Oops, a panic) on stderr as well
#
# LANES_VM_TCG=single (default) runs both vCPUs on one host thread, multi
# one host thread each.
#
# Inside the guest the host's filesystem is the root, read-only, with
# writable overlays (in guest memory) on /etc, /tmp, /usr, /var, /home and
# /opt; only the output directory writes through to the host. The guest
# has no network device. CMD runs in the current directory with
# LANES_VM_OUT (the output directory), LANES_VM_KERNEL (the --kernel
# given) and LANES_VM_KCONFIG (the kernel's build configuration, when found
# beside its image) set and the host's PATH (internal/vmtest reads them).
#
# One guest at a time: TCG keeps a host core busy per vCPU, and the
# machine is shared, so a second run.sh waits for the first (a lock file
# in the cache directory).
#
# Exit status: CMD's, or 124 on timeout, or 125 when the guest could not
# be started or ended without CMD's status (a panic, for instance).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kernel=newest timeout=1200 out=${LANES_VM_OUT:-} cpus=2 memory=3G console=0
usage() { sed -n '2,/^set -e/{/^#/s/^# \{0,1\}//p}' "$0" >&2; exit 2; }
while (($#)); do
	case "$1" in
	--kernel) kernel=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--cpus) cpus=$2; shift 2 ;;
	--memory) memory=$2; shift 2 ;;
	--console) console=1; shift ;;
	--) shift; break ;;
	-h | --help) usage ;;
	*) echo "run: unknown option $1 (the command goes after --)" >&2; exit 2 ;;
	esac
done
(($#)) || usage

vng=${LANES_VNG:-}
if [[ -z $vng ]]; then
	for v in /opt/lanes-vng/bin/vng "$(command -v vng || true)"; do
		[[ -n $v && -x $v ]] && { vng=$v; break; }
	done
fi
[[ -n $vng ]] || { echo "run: virtme-ng not found: run scripts/vm/deps.sh" >&2; exit 125; }
# vng runs its sibling virtme-run by name.
vngpath="$(dirname "$vng"):$PATH"
command -v qemu-system-x86_64 >/dev/null || { echo "run: qemu-system-x86_64 not found: run scripts/vm/deps.sh" >&2; exit 125; }

case "$kernel" in
newest | 6.12) vmlinuz=$("$here/fetch.sh" "$kernel") || exit 125 ;;
*)
	vmlinuz=$kernel
	[[ -f $vmlinuz ]] || { echo "run: no kernel image at $vmlinuz" >&2; exit 125; }
	;;
esac

if [[ -z $out ]]; then
	out=$(mktemp -d /tmp/lanes-vm.XXXXXX)
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The kernel's build configuration, beside its image in Debian's layouts
# (usr/lib/modules/V/{vmlinuz,config} or boot/{vmlinuz,config}-V).
kconfig=
for c in "$(dirname "$vmlinuz")/config" "$(dirname "$vmlinuz")/$(basename "$vmlinuz" | sed 's/^vmlinuz/config/')"; do
	[[ -f $c && $c != "$vmlinuz" ]] && { kconfig=$c; break; }
done

# The guest's command line: the environment, the directory, then CMD with
# each argument quoted for the guest's shell.
guestcmd="export LANES_VM_OUT=$(printf %q "$out") LANES_VM_KERNEL=$(printf %q "$kernel") LANES_VM_KCONFIG=$(printf %q "$kconfig") PATH=$(printf %q "$PATH");"
guestcmd+=" cd $(printf %q "$PWD") &&"
for a in "$@"; do guestcmd+=" $(printf %q "$a")"; done

cache=${LANES_VM_CACHE:-/var/cache/lanes-vm}
mkdir -p "$cache"
exec 8>"$cache/.run.lock"
if ! flock -n 8; then
	echo "run: waiting for another guest to finish" >&2
	flock 8
fi

# The guest reads kernel modules from the unpacked package in the cache,
# which lies under /var/cache, a directory virtme-ng gives the guest as an
# empty tmpfs: hand the cache in by itself. vng's output is piped: it
# writes the guest's stdout through two QEMU file chardevs opened apart,
# which overwrite each other's bytes when stdout is a regular file.
args=(--run "$vmlinuz" --disable-kvm --cpus "$cpus" --memory "$memory"
	--rwdir "$out" --cwd / --user root --exec "$guestcmd")
case "$vmlinuz" in "$cache"/*) args+=(--rodir "$cache") ;; esac
# vng --verbose sends the kernel console to stderr at loglevel 7; 5 keeps
# warnings, Oopses and panics and leaves out the info-level chatter of
# devices coming and going.
if ((console)); then
	args+=(--verbose --append loglevel=5)
fi
# Both vCPUs on one host thread (LANES_VM_TCG=multi: one thread each,
# QEMU's default). Under multi-threaded TCG the guest kernel panicked
# ("Oops: int3") when attaching tracing programs patched kernel text live
# while the other vCPU ran it; single-threaded it did not, and it was no
# slower on this shared 2-core machine.
case ${LANES_VM_TCG:-single} in
single) args+=(--qemu-opts="-accel tcg,thread=single") ;;
multi) ;;
*) echo "run: LANES_VM_TCG=${LANES_VM_TCG}: give single or multi" >&2; exit 2 ;;
esac

echo "run: booting $vmlinuz ($cpus vCPUs, ${LANES_VM_TCG:-single}-threaded TCG), output in $out" >&2
start=$SECONDS
set +e
PATH=$vngpath timeout -k 15 "$timeout" "$vng" "${args[@]}" </dev/null 2> >(cat >&2) | cat
rc=${PIPESTATUS[0]}
set -e
case $rc in
124) echo "run: timed out after ${timeout}s" >&2 ;;
255) echo "run: the guest ended without the command's exit status (a panic or a failed boot): exit 125" >&2; rc=125 ;;
esac
echo "run: guest done in $((SECONDS - start))s, exit $rc" >&2
exit "$rc"
