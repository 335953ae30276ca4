# Sourced by the README's commands (.ci/main-job.sh, .ci/run): one cache and one target dir
# for both, and the same build environment, so that running one after the other rebuilds nothing.
export VSE_CACHE=${VSE_CACHE:-/var/cache/vse}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$VSE_CACHE/target}
export CARGO_TERM_COLOR=never
# One build per run: incremental artifacts only cost disk and time here.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
# Every system library a crate links is recorded, so CI can check .ci/packages covers it.
export PKG_CONFIG="$(cd "$(dirname "${BASH_SOURCE:-$0}")" && pwd)/pkg-config-audit"
export VSE_PKG_CONFIG_LOG=$CARGO_TARGET_DIR/pkg-config-probes.log
mkdir -p "$VSE_CACHE" "$CARGO_TARGET_DIR"
