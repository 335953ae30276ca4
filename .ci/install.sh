#!/bin/sh
# .ci/install.sh main|test — installs the Debian packages that `.ci/packages` lists for one
# README command (only the missing ones; apt never starts services here). Needs root.
set -eu
cd "$(dirname "$0")"
want=${1:?usage: install.sh main|test}
pkgs=$(awk -v w="$want" '!/^#/ && NF { for (i = 2; i <= NF && $i ~ /^(main|test)$/; i++) if ($i == w) print $1 }' packages)
missing_now() {
    for p in $pkgs; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || printf ' %s' "$p"
    done
}
missing=$(missing_now)
# Fresh lists when installing, and when they are missing or a day old: the resolver reads apt's
# lists, and security suites' Release files expire within a week.
if [ -n "$missing" ] || ! ls /var/lib/apt/lists/*InRelease >/dev/null 2>&1 ||
    [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*InRelease' -mmin +1440 | head -n1)" ]; then
    apt-get update -qq
fi
# Installing one package can remove another that was there (a machine that came with a newer
# qemu-utils from backports loses it to qemu-system-x86 from the release), so what is missing
# is counted again after each pass, and anything still missing after the second is an error.
for pass in 1 2; do
    [ -n "$missing" ] || break
    echo "installing:$missing" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    missing=$(missing_now)
done
if [ -n "$missing" ]; then
    echo "install.sh: still not installed after two passes:$missing" >&2
    exit 1
fi
