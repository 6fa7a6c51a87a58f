#!/usr/bin/env bash
# Builds flanneld (Flannel is not in Debian) from the Go module proxy into
# /usr/local/lib/lanes/flanneld, for the testbed's real Flannel overlay
# (`lanes testbed up --overlay flanneld`). Idempotent: an installed binary
# of this version is kept.
#
# One backend's dependency (tencentvpc's cloud SDK) is not served by the
# proxy; the build drops that backend's import from a copy of the module,
# which leaves the vxlan backend the testbed uses as it is. The udp
# backend needs cgo, so the build keeps CGO on.
set -euo pipefail

version=v0.28.10
dest=/usr/local/lib/lanes/flanneld
if [[ -x $dest ]] && "$dest" --version 2>&1 | grep -qF "$version"; then
	exit 0
fi
echo "deps: building flanneld $version from the Go module proxy (about 2 minutes)"
work=$(mktemp -d)
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
dir=$(GOFLAGS=-mod=mod go mod download -json "github.com/flannel-io/flannel@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -n $dir ]] || { echo "deps: cannot download github.com/flannel-io/flannel@$version" >&2; exit 1; }
cp -r "$dir" "$work/flannel"
chmod -R u+w "$work/flannel"
sed -i '/pkg\/backend\/tencentvpc"/d' "$work/flannel/main.go"
(cd "$work/flannel" && CGO_ENABLED=1 go build -mod=mod \
	-ldflags "-X github.com/flannel-io/flannel/pkg/version.Version=$version" -o "$work/flanneld" .)
install -D -m 0755 "$work/flanneld" "$dest"
echo "deps: flanneld $version in $dest"
