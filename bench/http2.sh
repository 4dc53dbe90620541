#!/usr/bin/env bash
# bench/http2.sh: CPU per request through rustle's TLS proxy port, HTTP/2 against HTTP/1.1.
#
#   load (CPU 1) --TLS--> rustle --https (CPU 0, --workers 1) --> origin (CPU 1)
#
#   h2    h2load: C connections, M concurrent streams each, `:authority` naming the origin
#         and `:scheme http` (a proxied request, as a browser sends one to an HTTPS proxy)
#   h1    wrk with bench/wrk-proxy.lua: 64 kept-alive connections, absolute-form requests
#
# Both fetch 1 KB answers (`rustle-bench origin`, /bytes/1024). The figure that matters is
# the proxy's CPU time per request (utime+stime of the rustle process over the measured
# run, from /proc/PID/stat); requests/s is what the load generator reached on the shared
# CPU 1. REPS runs of each, alternating, medians printed, in each of two modes:
#
#   full    rustle has all of CPU 0. The load generator and the origin on CPU 1 set the
#           pace and the proxy idles between events, so it handles them one at a time.
#   capped  rustle is in a cgroup-v1 cpu group with a quota of half a core (as in
#           bench/http-core.sh and the campaign): the proxy sets the pace, as it does in
#           production under load, and work that arrives together is handled together.
#
# Usage: cargo build --release -p rustle -p rustle-bench && bench/http2.sh
# Knobs: DURATION [8] REPS [3] H2_CONNS [4] H2_STREAMS [32] MODES ["full capped"]
#        RUSTLE_BIN BENCH_BIN
# Needs: h2load (nghttp2-client), wrk; root and the cgroup-v1 cpu controller for
# `capped`. Loopback only; every process started is stopped
# by PID on exit.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
RUSTLE_BIN=${RUSTLE_BIN:-$ROOT/target/release/rustle}
BENCH_BIN=${BENCH_BIN:-$ROOT/target/release/rustle-bench}
DURATION=${DURATION:-8}
REPS=${REPS:-3}
H2_CONNS=${H2_CONNS:-4}
H2_STREAMS=${H2_STREAMS:-32}
MODES=${MODES:-"full capped"}
PROXY_PORT=${PROXY_PORT:-13443}
ORIGIN=127.0.0.1:${ORIGIN_PORT:-18081}
for tool in h2load wrk taskset; do
  command -v $tool >/dev/null || { echo "http2.sh: $tool is missing" >&2; exit 1; }
done
CG=
if [[ $MODES == *capped* ]]; then
  [[ -w /sys/fs/cgroup/cpu/cgroup.procs ]] \
    || { echo "http2.sh: capped mode needs root and /sys/fs/cgroup/cpu (or MODES=full)" >&2; exit 1; }
  CG=/sys/fs/cgroup/cpu/rustle-h2bench-$$
  mkdir "$CG"
fi
DIR=$(mktemp -d /dev/shm/rustle-h2bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -n $CG ]] && rmdir "$CG" 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

"$RUSTLE_BIN" cert --self-signed localhost --out "$DIR/certs" >/dev/null
taskset -c 1 "$BENCH_BIN" origin --listen "$ORIGIN" >/dev/null 2>&1 &
PIDS+=($!)
taskset -c 0 "$RUSTLE_BIN" --https 127.0.0.1:$PROXY_PORT --tls-cert "$DIR/certs/localhost.pem" \
  --tls-key "$DIR/certs/localhost.key" --workers 1 --log off 2>"$DIR/rustle.err" &
RUSTLE=$!
PIDS+=($RUSTLE)
sleep 1
[[ -n $CG ]] && echo "$RUSTLE" > "$CG/cgroup.procs"
set_mode() {
  [[ -z $CG ]] && return
  case $1 in
    full) echo -1 > "$CG/cpu.cfs_quota_us" ;;
    capped) echo 100000 > "$CG/cpu.cfs_period_us"; echo 50000 > "$CG/cpu.cfs_quota_us" ;;
  esac
}
TCK=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$RUSTLE/stat"; }

run_h2() {
  taskset -c 1 h2load -D "$DURATION" -c "$H2_CONNS" -m "$H2_STREAMS" \
    -H ":authority: $ORIGIN" -H ":scheme: http" "https://localhost:$PROXY_PORT/bytes/1024" \
    2>&1 | awk '/^requests:/ {print $8}'   # succeeded
}
run_h1() {
  WRK_TARGET="http://$ORIGIN/bytes/1024" taskset -c 1 wrk -t1 -c64 -d"${DURATION}s" \
    -s "$HERE/wrk-proxy.lua" "https://localhost:$PROXY_PORT" 2>&1 \
    | awk '/requests in/ {print $1}'
}

{
echo "mode,proto,rep,requests,seconds,rps,cpu_s,cpu_us_per_req"
for rep in $(seq 1 "$REPS"); do
 for mode in $MODES; do
  set_mode "$mode"
  for proto in h2 h1; do
    before=$(cpu_ticks)
    start=$(date +%s.%N)
    n=$(run_$proto)
    end=$(date +%s.%N)
    after=$(cpu_ticks)
    awk -v m=$mode -v p=$proto -v r=$rep -v n="$n" -v s="$start" -v e="$end" -v b="$before" \
        -v a="$after" -v t="$TCK" 'BEGIN {
      secs = e - s; cpu = (a - b) / t;
      printf "%s,%s,%d,%d,%.1f,%.0f,%.2f,%.2f\n", m, p, r, n, secs, n / secs, cpu, cpu * 1e6 / n }'
  done
 done
done
} | tee "$DIR/runs.csv"
echo
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for mode in $MODES; do
  for proto in h2 h1; do
    cpu=$(awk -F, -v m=$mode -v p=$proto '$1 == m && $2 == p {print $8}' "$DIR/runs.csv" | median)
    rps=$(awk -F, -v m=$mode -v p=$proto '$1 == m && $2 == p {print $6}' "$DIR/runs.csv" | median)
    echo "$mode $proto: median CPU $cpu us/request, median $rps requests/s"
  done
done
