#!/bin/sh
# .ci/mpicheck.sh — compiles the MPI message checker (barrier/c/mpicheck.c) with the host's
# mpicc and prints its path. The MPI migration tests put it into a `vse build` image of the
# same Debian suite as the host (same Open MPI), through a spec `files:` entry:
#   export VSE_MPICHECK=$(.ci/mpicheck.sh)
set -eu
cd "$(dirname "$0")/.."
command -v mpicc >/dev/null || { echo "mpicheck.sh: no mpicc; bash .ci/install.sh test" >&2; exit 1; }
OUT="${VSE_CACHE:-/var/cache/vse}/mpicheck"
mkdir -p "$OUT"
if [ ! -x "$OUT/mpicheck" ] || [ barrier/c/mpicheck.c -nt "$OUT/mpicheck" ]; then
    mpicc -O2 -Wall -Werror barrier/c/mpicheck.c -o "$OUT/mpicheck.tmp" >&2
    mv "$OUT/mpicheck.tmp" "$OUT/mpicheck"
fi
echo "$OUT/mpicheck"
