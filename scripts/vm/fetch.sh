#!/usr/bin/env bash
# fetch.sh KERNEL: brings one of Debian's prebuilt kernels into the cache
# and prints the path of its vmlinuz.
#
#   newest  the newest linux-image-amd64 of trixie-backports (7.x), which
#           builds in the BPF qdisc (CONFIG_NET_SCH_BPF=y) and BTF
#   6.12    trixie's own kernel (no BPF qdisc)
#
# apt runs with a private sources list, list directory, package cache and
# an empty dpkg status under the cache directory: the host's sources, lists
# and installed packages are neither read nor changed. The packages are
# unpacked with dpkg-deb, never installed. A kernel once unpacked is used
# again without the network; which version an alias names is looked up again
# after LANES_VM_ALIAS_DAYS days (default 7), or at once with --refresh, and
# when the lookup fails the cached kernel is used and a note says so.
#
# LANES_VM_MIRROR names another Debian mirror.
#
# Cache: $LANES_VM_CACHE (default /var/cache/lanes-vm):
#   apt/         the private apt state
#   <version>/   the unpacked packages (usr/lib/modules/<version>/ or boot/)
#   <alias>.ver  the version an alias named when it was last looked up
set -euo pipefail

usage() { echo "usage: $0 [--refresh] newest|6.12" >&2; exit 2; }

refresh=0
case "${1:-}" in --refresh) refresh=1; shift ;; esac
[[ $# -eq 1 ]] || usage
alias=$1
case "$alias" in
newest) suite=trixie-backports; need=(CONFIG_DEBUG_INFO_BTF CONFIG_NET_SCH_BPF) ;;
6.12) suite=trixie; need=(CONFIG_DEBUG_INFO_BTF) ;;
*) echo "fetch: unknown kernel $alias: give newest or 6.12" >&2; exit 2 ;;
esac

cache=${LANES_VM_CACHE:-/var/cache/lanes-vm}
days=${LANES_VM_ALIAS_DAYS:-7}
mirror=${LANES_VM_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$cache"
# One fetch at a time (two sessions may share the cache).
exec 9>"$cache/.lock"
flock 9

# vmlinuz_of VERSION: the kernel image inside an unpacked version, if any.
vmlinuz_of() {
	local d=$cache/$1
	for f in "$d/usr/lib/modules/$1/vmlinuz" "$d/boot/vmlinuz-$1"; do
		[[ -f $f ]] && { echo "$f"; return 0; }
	done
	return 1
}

# config_of VERSION: the kernel's build configuration.
config_of() {
	local d=$cache/$1
	for f in "$d/usr/lib/modules/$1/config" "$d/boot/config-$1"; do
		[[ -f $f ]] && { echo "$f"; return 0; }
	done
	return 1
}

# check VERSION: the configuration has every option the alias needs.
check() {
	local cfg opt bad=()
	cfg=$(config_of "$1") || { echo "fetch: no kernel config in $cache/$1" >&2; return 1; }
	for opt in "${need[@]}"; do
		grep -qx "$opt=y" "$cfg" || bad+=("$opt")
	done
	if ((${#bad[@]})); then
		echo "fetch: linux $1 lacks ${bad[*]} (in $cfg): it cannot serve as '$alias'" >&2
		return 1
	fi
}

done_ok() { [[ -f $cache/$1/.complete ]] && vmlinuz_of "$1" >/dev/null; }

aptdir=$cache/apt
aptopts=(
	-o "Dir::Etc::SourceList=$aptdir/sources.list"
	-o "Dir::Etc::SourceParts=$aptdir/sources.list.d"
	-o "Dir::Etc::Preferences=$aptdir/preferences"
	-o "Dir::Etc::PreferencesParts=$aptdir/preferences.d"
	-o "Dir::State=$aptdir/state"
	-o "Dir::State::Lists=$aptdir/lists"
	-o "Dir::State::status=$aptdir/status"
	-o "Dir::Cache=$aptdir/cache"
	-o "Dir::Cache::Archives=$aptdir/archives"
	-o "APT::Architecture=amd64"
	-o "APT::Architectures::=amd64"
	-o "Acquire::Languages=none"
	-o "Debug::NoLocking=1"
	-o "APT::Sandbox::User=root"
	-o "quiet=2"
)
apt_setup() {
	mkdir -p "$aptdir"/{sources.list.d,preferences.d,state,lists/partial,cache,archives/partial}
	: >"$aptdir/status"
	: >"$aptdir/preferences"
	local key=/usr/share/keyrings/debian-archive-keyring.gpg
	[[ -f $key ]] || { echo "fetch: $key missing: apt-get install debian-archive-keyring" >&2; return 1; }
	cat >"$aptdir/sources.list" <<-EOF
		deb [signed-by=$key] $mirror trixie main
		deb [signed-by=$key] $mirror trixie-backports main
	EOF
	apt-get "${aptopts[@]}" update >&2
}

# lookup: the kernel version (e.g. 7.3.4+deb13-amd64) that the suite's
# linux-image-amd64 depends on.
lookup() {
	local ver dep
	ver=$(apt-cache "${aptopts[@]}" madison linux-image-amd64 |
		awk -F' *[|] *' -v s="$suite" '$3 ~ (" " s "/main ") {print $2; exit}')
	[[ -n $ver ]] || { echo "fetch: no linux-image-amd64 in $suite" >&2; return 1; }
	dep=$(apt-cache "${aptopts[@]}" show "linux-image-amd64=$ver" |
		sed -n 's/^Depends:.*\blinux-image-\([0-9][^ ,]*-amd64\).*/\1/p' | head -1)
	[[ -n $dep ]] || { echo "fetch: linux-image-amd64 $ver names no kernel image" >&2; return 1; }
	echo "$dep"
}

# unpack VERSION: downloads the version's packages (up to 7.x's split:
# linux-image, or linux-binary + linux-modules + linux-base) and unpacks
# them into $cache/VERSION, then regenerates modules.dep (virtme-ng loads
# modules by it).
unpack() {
	local kver=$1 p pkgs=() tmp
	for p in linux-image linux-binary linux-modules linux-base; do
		if apt-cache "${aptopts[@]}" show "$p-$kver" >/dev/null 2>&1; then
			pkgs+=("$p-$kver")
		fi
	done
	((${#pkgs[@]})) || { echo "fetch: no packages for linux $kver" >&2; return 1; }
	tmp=$(mktemp -d "$cache/.unpack.XXXXXX")
	trap 'rm -rf "$tmp"' RETURN
	echo "fetch: downloading ${pkgs[*]}" >&2
	(cd "$tmp" && apt-get "${aptopts[@]}" download "${pkgs[@]}" >&2)
	mkdir "$tmp/root"
	for p in "$tmp"/*.deb; do
		dpkg-deb -x "$p" "$tmp/root"
	done
	rm -rf "${cache:?}/$kver"
	mv "$tmp/root" "$cache/$kver"
	local moddir
	for moddir in "$cache/$kver/usr/lib/modules/$kver" "$cache/$kver/lib/modules/$kver"; do
		[[ -d $moddir ]] || continue
		depmod -a -b "${moddir%/lib/modules/$kver}" "$kver"
		break
	done
	vmlinuz_of "$kver" >/dev/null || { echo "fetch: no vmlinuz in the packages of linux $kver" >&2; return 1; }
	config_of "$kver" >/dev/null || { echo "fetch: no kernel config in the packages of linux $kver" >&2; return 1; }
	touch "$cache/$kver/.complete"
}

verfile=$cache/$alias.ver
kver=
if [[ -f $verfile ]]; then
	kver=$(<"$verfile")
fi
stale=1
if [[ -n $kver ]] && done_ok "$kver" && ((!refresh)) &&
	[[ -z $(find "$verfile" -mtime "+$((days - 1))" 2>/dev/null) ]]; then
	stale=0
fi

if ((stale)); then
	if apt_setup && new=$(lookup); then
		kver=$new
		echo "$kver" >"$verfile"
	elif [[ -n $kver ]] && done_ok "$kver"; then
		echo "fetch: looking up '$alias' failed; using the cached linux $kver" >&2
	else
		echo "fetch: cannot look up '$alias' in Debian's $suite (no network or no mirror?)" >&2
		exit 1
	fi
fi

if ! done_ok "$kver"; then
	unpack "$kver"
fi
check "$kver"
vmlinuz_of "$kver"
