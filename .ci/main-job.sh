#!/usr/bin/env bash
# The README's main job on the embedded default: this machine, the host's apt mirrors.
# check → lock → build → run the minimal example (busybox on Debian's cloud kernel) in a VM.
# Installs what it needs first (QEMU, e2fsprogs, the static busybox for the host-side test
# tools), builds vse in release mode and the static guest agent. Idempotent; outputs go to
# ${VSE_OUT:-./vse-out}.
set -euo pipefail
cd "$(dirname "$0")/.."
export VSE_CACHE=${VSE_CACHE:-/var/cache/vse}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$VSE_CACHE/target}
OUT=${VSE_OUT:-$PWD/vse-out}
mkdir -p "$VSE_CACHE" "$OUT"

need=()
for p in qemu-system-x86 qemu-utils e2fsprogs cpio; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ] || ! ls /var/lib/apt/lists/*_InRelease >/dev/null 2>&1; then
  apt-get update -qq
fi
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

cargo build --release --locked -q --bin vse
VSE="$CARGO_TARGET_DIR/release/vse"
VSE_GUEST_AGENT=$(bash .ci/guest-agent.sh)
export VSE_GUEST_AGENT

set -x
"$VSE" check specs/minimal.vse.yaml --policy specs/site.policy.yaml --policy specs/partition.policy.yaml --explain
"$VSE" lock specs/minimal.vse.yaml --policy specs/site.policy.yaml --policy specs/partition.policy.yaml -o "$OUT/minimal.lock"
"$VSE" build "$OUT/minimal.lock" -o "$OUT/minimal.img"
"$VSE" run "$OUT/minimal.img" -- sh -c 'echo "hello from $(uname -n), kernel $(uname -r)"; busybox | head -n 1'
