#!/usr/bin/env bash
# The README's main job on the embedded default: this machine, the host's apt mirrors.
# Installs what it needs (.ci/packages, rows marked `main`), installs vse the conventional way
# (`cargo install --locked --path .`, the guest agent built in), then, from an empty directory
# with no flag or variable pointing back at this repository: check → lock → build → run the
# minimal example (busybox on Debian's cloud kernel) in a VM, and `vse launch` the spec itself.
# Idempotent; outputs go to ${VSE_OUT:-./vse-out}.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/env.sh
OUT=${VSE_OUT:-$PWD/vse-out}
SPECS=$PWD/specs
PREFIX=$VSE_CACHE/prefix
mkdir -p "$OUT"

bash .ci/install.sh main
cargo install --locked --quiet --path . --root "$PREFIX"
VSE=$PREFIX/bin/vse
unset VSE_GUEST_AGENT

cd "$OUT"
POL=(--policy "$SPECS/site.policy.yaml" --policy "$SPECS/partition.policy.yaml")
set -x
"$VSE" check "$SPECS/minimal.vse.yaml" "${POL[@]}" --explain
"$VSE" lock "$SPECS/minimal.vse.yaml" "${POL[@]}" -o minimal.lock
"$VSE" build minimal.lock -o minimal.img
"$VSE" run minimal.img -- sh -c 'echo "hello from $(uname -n), kernel $(uname -r)"; busybox | head -n 1'
"$VSE" launch "$SPECS/minimal.vse.yaml" "${POL[@]}" --allocation local:2 -- sh -c 'echo "rank $VSE_RANK of $VSE_SIZE on $(uname -n)"'
