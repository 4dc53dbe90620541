#!/usr/bin/env bash
# Run every cargo-fuzz target for the given time each, one after the other:
#   fuzz/run-all.sh 5m        (or 30s, 1h, or plain seconds: 300)
# Needs a nightly toolchain and cargo-fuzz (see fuzz/README.md). Without them it says
# so and exits 0, so CI can call it unconditionally. Crashes are kept in
# fuzz/artifacts/TARGET/; the script exits 1 if any target found one.
set -uo pipefail
# cargo-fuzz runs from the project root, where it finds fuzz/.
cd "$(dirname "$0")/.."

case "${1:-}" in
  *h) secs=$(( ${1%h} * 3600 )) ;;
  *m) secs=$(( ${1%m} * 60 )) ;;
  *s) secs=${1%s} ;;
  [0-9]*) secs=$1 ;;
  *) echo "usage: $0 DURATION (per target: 30s, 5m, 1h or seconds)" >&2; exit 2 ;;
esac

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: skipped, no nightly toolchain (cargo +nightly) on this machine"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: skipped, cargo-fuzz is not installed (cargo install cargo-fuzz)"
  exit 0
fi

targets=$(cargo +nightly fuzz list)
failed=()
for t in $targets; do
  echo "fuzz: $t for ${secs}s"
  dict=()
  case "$t" in request_head|response_head|h2_request|chunked) dict=(-dict=fuzz/http.dict) ;; esac
  mkdir -p "fuzz/corpus/$t"
  if ! cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" "${dict[@]}" \
    -print_final_stats=1 2>&1 | grep -E '^(stat::number_of_executed_units|==|SUMMARY|Done|INFO: -max_total_time)|panicked'; then
    :
  fi
  if [ -n "$(ls -A "fuzz/artifacts/$t" 2>/dev/null)" ]; then
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]} (see fuzz/artifacts/)"
  exit 1
fi
echo "fuzz: $(echo $targets | wc -w) targets, no crash"
