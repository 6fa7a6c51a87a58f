#!/bin/sh
# Installs lanes as a systemd service: the binary, the unit and, unless
# one is there already, the example configuration. Run as root from the
# repository after `make build`. DESTDIR stages into another root (packaging);
# PREFIX defaults to /usr/local.
set -eu

DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
BIN=${BIN:-bin/lanes}
UNITDIR=${UNITDIR:-/etc/systemd/system}

if [ ! -x "$BIN" ]; then
	echo "install.sh: $BIN is missing: run make build first" >&2
	exit 1
fi

install -D -m 0755 "$BIN" "$DESTDIR$PREFIX/bin/lanes"
sed "s|/usr/local/bin/lanes|$PREFIX/bin/lanes|" deploy/systemd/lanes.service >"${TMPDIR:-/tmp}/lanes.service.$$"
install -D -m 0644 "${TMPDIR:-/tmp}/lanes.service.$$" "$DESTDIR$UNITDIR/lanes.service"
rm -f "${TMPDIR:-/tmp}/lanes.service.$$"

conf="$DESTDIR/etc/lanes/lanes.yaml"
if [ -e "$conf" ]; then
	echo "kept $conf (the example is deploy/lanes.yaml)"
else
	install -D -m 0644 deploy/lanes.yaml "$conf"
	echo "installed $conf: set netns and mode, then: systemctl enable --now lanes"
fi

# systemd picks the unit up only where it runs.
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload
fi
echo "installed $DESTDIR$PREFIX/bin/lanes and $DESTDIR$UNITDIR/lanes.service"
