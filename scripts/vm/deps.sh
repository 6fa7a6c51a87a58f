#!/usr/bin/env bash
# Installs what the guest-kernel harness needs, idempotently: QEMU, kmod
# (depmod, for the unpacked kernels' modules), udev (without it virtme-ng
# cannot hand back the command's exit status), the Debian archive keys
# (fetch.sh checks Debian's trixie suites with them) and virtme-ng, from
# PyPI, in a venv of its own at $LANES_VNG_VENV (default /opt/lanes-vng).
# Quiet and quick when everything is present.
set -euo pipefail

venv=${LANES_VNG_VENV:-/opt/lanes-vng}
# The version the harness was tried with; LANES_VNG_VERSION= (empty) takes
# PyPI's newest.
vngver=${LANES_VNG_VERSION-1.42}

pkgs=(qemu-system-x86 kmod udev python3-venv debian-archive-keyring file)
# shellcheck source=scripts/debs.sh
. "$(dirname "$0")/../debs.sh"
install_debs "vm deps" "${pkgs[@]}" || true

want=virtme-ng${vngver:+==$vngver}
if ! "$venv/bin/vng" --version >/dev/null 2>&1 ||
	{ [[ -n $vngver ]] && [[ $("$venv/bin/pip" show virtme-ng 2>/dev/null | sed -n 's/^Version: //p') != "$vngver" ]]; }; then
	echo "vm deps: installing $want into $venv"
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q --disable-pip-version-check "$want"
fi
echo "vm deps: ok ($("$venv/bin/vng" --version 2>&1 | head -1), $(qemu-system-x86_64 --version | head -1))"
