#!/bin/sh
# .ci/msgcheck.sh — builds the statically linked `vse-msgcheck` (barrier/src/bin/vse-msgcheck.rs:
# a message-checking program that calls the barrier library at every step) and prints its path.
# tests/launch_migrate.rs puts it into a `vse build` image through a spec `files:` entry:
#   export VSE_MSGCHECK=$(.ci/msgcheck.sh)
set -eu
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-/work/targets/guest-agent}"
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$TARGET_DIR" \
    cargo build -q -p vse-barrier --bin vse-msgcheck --release --target x86_64-unknown-linux-gnu >&2
BIN="$TARGET_DIR/x86_64-unknown-linux-gnu/release/vse-msgcheck"
if readelf -l "$BIN" 2>/dev/null | grep -q INTERP; then
    echo "msgcheck.sh: $BIN is dynamically linked" >&2
    exit 1
fi
echo "$BIN"
