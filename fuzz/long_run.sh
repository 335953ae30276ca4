#!/usr/bin/env bash
# The long fuzzing runs behind the figures in README.md: each target in turn for SECONDS
# seconds (fork mode, one worker: crashes, timeouts and OOMs are saved under artifacts/<target>/
# and fuzzing goes on), growing a working corpus under corpus-work/<target> (not committed;
# `cargo fuzz cmin` it into corpus/ by hand if wanted). Logs: logs/<target>.log.
# Usage: fuzz/long_run.sh SECONDS TARGET...
set -euo pipefail
cd "$(dirname "$0")"
secs=$1
shift
B=${CARGO_TARGET_DIR:-/var/cache/vse-fuzz/target}/x86_64-unknown-linux-gnu/release
mkdir -p logs
for t in "$@"; do
  mkdir -p "corpus-work/$t" "artifacts/$t" "corpus/$t"
  extra=()
  case $t in
    stage_receiver) extra=(-max_len=4096 -len_control=0) ;;
    deb_extract | oci_import) extra=(-max_len=65536) ;;
  esac
  "$B/$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 "${extra[@]}" \
    -artifact_prefix="artifacts/$t/" "corpus-work/$t" "corpus/$t" >"logs/$t.log" 2>&1 || true
done
