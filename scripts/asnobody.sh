#!/usr/bin/env bash
# go test -exec helper for `make unit`: runs a test binary as nobody, so
# that a test which needs root without saying so (testenv.Root) fails
# there instead of passing only because CI runs as root. go test builds
# the binary in a directory only its owner can enter: copy it out first.
# Without root it runs the binary as is.
set -euo pipefail
bin=$1
shift
if [[ $EUID -ne 0 ]]; then
	exec "$bin" "$@"
fi
dir=$(mktemp -d /tmp/lanes-unit.XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 755 "$dir"
cp "$bin" "$dir/"
chmod 755 "$dir/$(basename "$bin")"
HOME=$dir XDG_CACHE_HOME=$dir setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$dir/$(basename "$bin")" "$@"
