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
# CPU 1. REPS runs of each, alternating, medians printed.
#
# Usage: cargo build --release -p rustle -p rustle-bench && bench/http2.sh
# Knobs: DURATION [8] REPS [3] H2_CONNS [4] H2_STREAMS [32] RUSTLE_BIN BENCH_BIN
# Needs: h2load (nghttp2-client), wrk. Loopback only; every process started is stopped
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
PROXY_PORT=${PROXY_PORT:-13443}
ORIGIN=127.0.0.1:${ORIGIN_PORT:-18081}
for tool in h2load wrk taskset; do
  command -v $tool >/dev/null || { echo "http2.sh: $tool is missing" >&2; exit 1; }
done
DIR=$(mktemp -d /dev/shm/rustle-h2bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
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
echo "proto,rep,requests,seconds,rps,cpu_s,cpu_us_per_req"
for rep in $(seq 1 "$REPS"); do
  for proto in h2 h1; do
    before=$(cpu_ticks)
    start=$(date +%s.%N)
    n=$(run_$proto)
    end=$(date +%s.%N)
    after=$(cpu_ticks)
    awk -v p=$proto -v r=$rep -v n="$n" -v s="$start" -v e="$end" -v b="$before" \
        -v a="$after" -v t="$TCK" 'BEGIN {
      secs = e - s; cpu = (a - b) / t;
      printf "%s,%d,%d,%.1f,%.0f,%.2f,%.2f\n", p, r, n, secs, n / secs, cpu, cpu * 1e6 / n }'
  done
done
} | tee "$DIR/runs.csv"
echo
for proto in h2 h1; do
  cpu=$(awk -F, -v p=$proto '$1 == p {print $7}' "$DIR/runs.csv" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  rps=$(awk -F, -v p=$proto '$1 == p {print $5}' "$DIR/runs.csv" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  echo "$proto: median CPU $cpu us/request, median $rps requests/s"
done
