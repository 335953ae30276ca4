#!/bin/sh
# .ci/check-syslibs.sh LOG — fails when a pkg-config module that a crate's build script found
# (LOG, written by .ci/pkg-config-audit) comes from a Debian package that .ci/packages does not
# list for both README commands: a fresh machine would then fail to build `vse`.
set -eu
cd "$(dirname "$0")"
log=${1:?usage: check-syslibs.sh LOG}
[ -s "$log" ] || { echo "check-syslibs: $log is empty: the build recorded no pkg-config probe (was PKG_CONFIG=.ci/pkg-config-audit set for a clean build?)" >&2; exit 1; }
bad=0
for mod in $(cut -d" " -f1 "$log" | sort -u); do
    pc=$(pkg-config --variable=pcfiledir "$mod")/$mod.pc
    pkg=$(dpkg-query -S "$pc" 2>/dev/null | cut -d: -f1 | head -n1)
    if [ -z "$pkg" ]; then
        echo "check-syslibs: pkg-config module $mod ($pc) belongs to no Debian package" >&2
        bad=1
        continue
    fi
    row=$(awk -v p="$pkg" '$1 == p' packages)
    case "$row" in
        *main*test*) echo "check-syslibs: $mod <- $pkg (listed)" ;;
        *) echo "check-syslibs: $mod comes from $pkg, which .ci/packages does not list for main and test" >&2; bad=1 ;;
    esac
done
exit $bad
