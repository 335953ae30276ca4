#!/bin/sh
# .ci/static-build.sh PACKAGE BIN — builds BIN of PACKAGE statically linked (glibc's static
# libraries, crt-static, stripped) and prints its path. The same command, settings and target
# dir as build.rs uses for the agent embedded in `vse`, so those builds are shared, not repeated.
set -eu
cd "$(dirname "$0")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-${VSE_CACHE:-/var/cache/vse}/target}/vse-guest-agent"
CARGO_ENCODED_RUSTFLAGS="-Ctarget-feature=+crt-static" CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo build -q --release --locked -p "$1" --bin "$2" --target x86_64-unknown-linux-gnu \
    --target-dir "$TARGET_DIR" >&2
BIN="$TARGET_DIR/x86_64-unknown-linux-gnu/release/$2"
if readelf -l "$BIN" 2>/dev/null | grep -q INTERP; then
    echo "static-build.sh: $BIN is dynamically linked" >&2
    exit 1
fi
echo "$BIN"
