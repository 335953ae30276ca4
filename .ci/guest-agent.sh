#!/bin/sh
# .ci/guest-agent.sh — builds the statically linked guest agent that `vse build` bakes into
# every image, and prints its path. The builder finds it through VSE_GUEST_AGENT:
#   export VSE_GUEST_AGENT=$(.ci/guest-agent.sh)
# Static (glibc static libraries, crt-static) so it runs on any distribution or suite.
set -eu
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-/work/targets/guest-agent}"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$TARGET_DIR" \
    cargo build -q -p vse-guest-agent --release --target x86_64-unknown-linux-gnu >&2
BIN="$TARGET_DIR/x86_64-unknown-linux-gnu/release/vse-guest-agent"
if readelf -l "$BIN" 2>/dev/null | grep -q INTERP; then
    echo "guest-agent.sh: $BIN is dynamically linked" >&2
    exit 1
fi
echo "$BIN"
