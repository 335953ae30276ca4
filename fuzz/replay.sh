#!/usr/bin/env bash
# Builds the fuzz targets, replays each target's committed corpus (seeds and regression inputs:
# any crash, timeout or OOM fails), then fuzzes each target briefly from that corpus.
# Budget: 12 targets x FUZZ_SECONDS (default 8) of fuzzing plus the replays: about 2.5
# minutes on 2 cores once built. The CI calls it after the build step (.ci/run).
# Env: FUZZ_SECONDS (per-target fuzzing time; 0 = replay only), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-8}
targets=(spec policy lockfile debian_index deb_extract oci_import image_manifest agent_frame
  qmp_reply stage_receiver status_http guest_protocol)

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
# Release with debug assertions (integer overflow is a finding); the same flags as the long runs.
cargo +nightly fuzz build -O --debug-assertions
bin=${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "$work/$t" "$work/artifacts-$t"
  common=(-rss_limit_mb=2048 -timeout=20 -artifact_prefix="$work/artifacts-$t/")
  echo "== $t: replaying $(find "corpus/$t" -type f | wc -l) inputs"
  if ! "$bin/$t" "${common[@]}" -runs=0 "corpus/$t" >"$work/$t.replay.log" 2>&1; then
    tail -n 40 "$work/$t.replay.log"
    echo "fuzz/replay.sh: $t fails on its committed corpus" >&2
    fail=1
    continue
  fi
  # stage_receiver's memory grows across many runs in one process (an open finding, see
  # README.md): its corpus is replayed here, its fuzzing runs in long_run.sh only.
  if [ "$t" = stage_receiver ] && [ "$secs" -gt 0 ]; then
    echo "== $t: replay only (open finding: memory growth across runs, see fuzz/README.md)"
  elif [ "$secs" -gt 0 ]; then
    extra=()
    case $t in
      stage_receiver) extra=(-max_len=4096 -len_control=0) ;;
      deb_extract | oci_import) extra=(-max_len=65536) ;;
    esac
    # New inputs go to a scratch corpus; the committed one only seeds it.
    if ! "$bin/$t" "${common[@]}" "${extra[@]}" -max_total_time="$secs" "$work/$t" "corpus/$t" \
      >"$work/$t.fuzz.log" 2>&1; then
      tail -n 40 "$work/$t.fuzz.log"
      echo "fuzz/replay.sh: $t found a new crash/timeout/OOM; the input:" >&2
      ls "$work/artifacts-$t/" >&2
      mkdir -p artifacts/"$t" && cp "$work/artifacts-$t/"* artifacts/"$t"/ 2>/dev/null || true
      fail=1
    else
      grep -E '^#[0-9]+ +DONE' "$work/$t.fuzz.log" | tail -n 1 || true
    fi
  fi
done
exit $fail
