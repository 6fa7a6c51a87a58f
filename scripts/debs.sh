# Sourced by the deps scripts. install_debs LABEL PKG...: installs the
# Debian packages not yet installed, quietly, and returns 0 when it
# installed some, 1 when nothing was missing; without root it names what is
# missing and exits.
install_debs() {
	local label=$1 p
	shift
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	((${#missing[@]})) || return 1
	if [[ $EUID -ne 0 ]]; then
		echo "$label: missing Debian packages ${missing[*]}: run as root (sudo make deps)" >&2
		exit 1
	fi
	echo "$label: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
